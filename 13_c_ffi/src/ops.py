"""Stage 13: the C library as torch.library operators, so that torch.compile can trace it.

What this stage teaches: torch.compile cannot look inside ctypes: tracing runs on FakeTensors,
which have shapes but no memory, and a pointer to no memory cannot be passed to C. Registered
as a custom operator, the C call becomes one opaque node of the graph:

    eml_c_ffi::add(Tensor a, Tensor b) -> Tensor
    eml_c_ffi::add_backward(Tensor grad) -> (Tensor, Tensor)
    eml_c_ffi::linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor

each with a fake ("meta") function that tells the tracer the output's shape and dtype without
running C; add and linear have an autograd formula, add_backward none (so a second
derivative through ops.add is an error that names it, tested). torch.compile(fullgraph=True) then compiles a model that
calls them without a graph break (tested); torch.library.opcheck checks the registrations.
What changed: a new route (README). Run it: ``pytest 13_c_ffi/tests -k compile``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import layer

# ---- 1. add, and its backward as a second operator ----------------------------------------
@torch.library.custom_op("eml_c_ffi::add", mutates_args=())
def add(a: Tensor, b: Tensor) -> Tensor:
    return layer.add(a, b)  # the checks, then C


@add.register_fake
def _(a, b):
    # Why: the tracer needs the output's shape and dtype without calling C (a fake tensor has no memory).
    layer.check_add_inputs(a, b)
    return torch.empty_like(a, memory_format=torch.contiguous_format)


@torch.library.custom_op("eml_c_ffi::add_backward", mutates_args=())
def add_backward(grad: Tensor) -> tuple[Tensor, Tensor]:
    return layer.add_backward(grad)


@add_backward.register_fake
def _(grad):
    # Why: as above, two outputs shaped like the gradient.
    return torch.empty_like(grad, memory_format=torch.contiguous_format), torch.empty_like(grad, memory_format=torch.contiguous_format)


def _add_backward(ctx, grad):
    # Why: autograd's formula for the operator; an operator, so it is traced (and compiled) too.
    grad_a, grad_b = add_backward(grad)
    return grad_a, grad_b


add.register_autograd(_add_backward)


# ---- 2. linear, whose backward is linear again --------------------------------------------
@torch.library.custom_op("eml_c_ffi::linear", mutates_args=())
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    return layer.linear(input, weight, bias)  # the checks, then C


@linear.register_fake
def _(input, weight, bias=None):
    # Why: output shape (*, out_features) for the tracer, and the same shape/dtype errors at trace time.
    layer.check_linear_inputs(input, weight, bias)
    return input.new_empty(*input.shape[:-1], weight.shape[0])


def _linear_setup_context(ctx, inputs, output):
    # Why: save what the backward needs (x for grad_weight, W for grad_input).
    input, weight, bias = inputs
    ctx.save_for_backward(input, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad_output):
    # Why: the formulas of layer.LinearFunction, written with the operator itself, so they are
    # differentiable again (double backward) and traceable by torch.compile.
    input, weight = ctx.saved_tensors
    grad_output_2d = layer.as_rows(grad_output)
    grad_input = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_input = linear(grad_output_2d, weight.t(), None).reshape(input.shape)
    if ctx.needs_input_grad[1]:
        grad_weight = linear(grad_output_2d.t(), layer.as_rows(input).t(), None)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad_output_2d.sum(dim=0)
    return grad_input, grad_weight, grad_bias


linear.register_autograd(_linear_backward, setup_context=_linear_setup_context)
