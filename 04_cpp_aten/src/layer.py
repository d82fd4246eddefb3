"""Stage 04: the forward and backward pass in C++ (FunctionCpp.cpp), the products by ATen.

What this stage teaches: how a ``torch.autograd.Function`` hands its work to a C++ extension.
``Function.forward`` and ``Function.backward`` keep stage 02's contract; their bodies now call
the compiled module ``_C``, built by setup.py from FunctionCpp.cpp:

    _C.forward(input, weight, bias)                 y = x W^T + b, bias may be None
    _C.backward(grad_output, input, weight,         [grad_input, grad_weight, grad_bias],
                need_input, need_weight, need_bias)   None for each one not asked for

The course's own two declarations, ``forward(input, weight)`` and
``backward(grad_output, input, weights)``, are bound too (tests/ call them directly).
What changed since stage 02: the maths and the input checks moved to C++ (validation lives in
``check_inputs`` in FunctionCpp.cpp); C++ also flattens (*, in) to (N, in) and back. The
backward is marked ``once_differentiable`` (see ``Function.backward_once``): the contract of
the pybind11 C++ linear stages (04-07), since the raw-pointer loops of stages 05 and 06 are
invisible to autograd (stage 08's registered operators give their backward a backward again).
Run it: ``pip install --no-build-isolation .`` here, then ``pytest tests``.
"""

import math

import torch

from . import _C  # the compiled FunctionCpp.cpp; import torch first: _C links against libtorch


class Function(torch.autograd.Function):
    """y = x W^T + b, forward and backward in C++. Call it as Function.apply(input, weight, bias)."""

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        needs_input, needs_weight = ctx.needs_input_grad[:2]
        # Save only what the requested gradients need: grad_input needs W, grad_weight needs x.
        ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)
        # C++ checks the inputs, then computes x W^T + b for any leading dimensions.
        return _C.forward(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        return Function.backward_once(ctx, grad_output, input, weight)

    # The pybind11 C++ stages' contract: their gradients are not differentiated again (stages 05 and 06
    # compute them on raw pointers, which autograd never sees; this stage's at::mm would still
    # be recorded, but shares the contract). The decorator
    # runs the body under no_grad and, under create_graph=True, makes a second backward raise
    # "trying to differentiate twice" instead of silently treating the gradients as constants.
    # It decides from the arguments of the function it decorates alone: x and W are passed as
    # arguments here, since grad_output alone is often a constant (the ones of a .sum()).
    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward_once(ctx, grad_output, input, weight):
        # needs_input_grad has one flag per forward argument: 2 when apply(input, weight).
        needs_input, needs_weight, needs_bias = (*ctx.needs_input_grad, False)[:3]
        # C++ computes only the gradients asked for and returns None for the others.
        grad_input, grad_weight, grad_bias = _C.backward(grad_output, input, weight, needs_input, needs_weight, needs_bias)
        # One gradient per forward argument: input, weight, bias (an extra None is allowed).
        return grad_input, grad_weight, grad_bias


class Layer(torch.nn.Module):
    """y = x W^T + b for an input of shape (*, in_features): a drop-in for torch.nn.Linear."""

    def __init__(self, in_features: int = None, out_features: int = None, bias: bool = True, device=None, dtype=None,
                 *, i_n_features_input: int = None, i_n_features_output: int = None):
        super().__init__()
        # nn.Linear's argument names, or the course's (i_n_features_input, i_n_features_output).
        in_features = in_features if i_n_features_input is None else i_n_features_input
        out_features = out_features if i_n_features_output is None else i_n_features_output
        if in_features is None or out_features is None:
            raise TypeError(f"Layer() needs in_features and out_features, got {in_features} and {out_features}")
        self.in_features = in_features
        self.out_features = out_features
        factory = {"device": device, "dtype": dtype}  # as nn.Linear: where and in which dtype the parameters live
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)  # keeps `layer.bias` defined (as None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The same initialisation as torch.nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) for both.
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return Function.apply(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
