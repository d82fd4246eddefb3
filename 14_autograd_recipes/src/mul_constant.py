"""Stage 14, recipe 1: ``MulConstant``, and what ``ctx.set_materialize_grads(False)`` changes.

What this teaches: a Function's ``backward`` normally receives a zero-filled tensor for every
output whose gradient autograd does not know (autograd *materializes* it). With
``ctx.set_materialize_grads(False)`` it receives ``None`` instead, which saves allocating and
multiplying zeros, but the backward must then handle ``None`` itself.
When does ``None`` arrive? When nothing downstream produced a gradient for the output: a later
Function returned ``None`` for it, or (with several outputs) that output was not used.
This is also the modern form of a Function: ``forward`` without ``ctx``, and a separate
``setup_context`` (it lets ``torch.func`` transforms call the forward).
Run it: ``pip install --no-build-isolation .`` in 14_autograd_recipes, then ``pytest tests``.
"""

import numbers

import torch


class MulConstant(torch.autograd.Function):
    """y = x * c for a tensor x and a Python number c (no gradient for c)."""

    @staticmethod
    def forward(tensor, constant):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"MulConstant: expected a tensor as the first argument, got {type(tensor).__name__}")
        if not isinstance(constant, numbers.Number) or isinstance(constant, bool):
            raise TypeError(f"MulConstant: expected a Python number as the constant, got {constant!r} ({type(constant).__name__})")
        return tensor * constant

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, constant = inputs
        ctx.set_materialize_grads(False)  # backward may now receive None: handled below
        ctx.constant = constant           # a number, not a tensor: a plain attribute, not save_for_backward

    @staticmethod
    def backward(ctx, grad_output):
        # One gradient per forward input (tensor, constant); the constant never gets one.
        if grad_output is None:           # no gradient flowed into y: none flows out to x
            return None, None
        return grad_output * ctx.constant, None


def tour_check():
    """(ok, line): gradcheck in float64, and the None path taken through a real graph."""
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    passed = torch.autograd.gradcheck(lambda t: MulConstant.apply(t, 2.5), (x,), raise_exception=False)
    grads_seen = []

    class DropGradient(torch.autograd.Function):  # a later Function that returns no gradient
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, grad):
            return None

    class Spy(MulConstant):
        @staticmethod
        def backward(ctx, grad_output):
            grads_seen.append(grad_output)
            return MulConstant.backward(ctx, grad_output)

    other = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    (DropGradient.apply(Spy.apply(x, 2.5)) + other).sum().backward()
    none_ok = grads_seen == [None] and x.grad is None
    ok = passed and none_ok
    return ok, (f"float64 gradcheck: {'pass' if passed else 'FAIL'}; "
                f"backward given None returns None: {'yes' if none_ok else 'NO'}")
