"""Stage 05: the forward and backward pass in C++ (FunctionCpp.cpp), the products by our own loops.

What this stage teaches: what ATen's matrix multiplication did for stage 04. The compiled
module ``_C`` computes the three products of a linear layer with plain loops over raw
pointers, threaded with ``at::parallel_for``, in one of two loop orders:

    _C.forward(input, weight, bias, loop_order)      y = x W^T + b, bias may be None
    _C.backward(grad_output, input, weight,          [grad_input, grad_weight, grad_bias],
                need_input, need_weight, need_bias,    None for each one not asked for
                loop_order)

``loop_order`` is ``"cache_aware"`` (the default: innermost loops over contiguous memory, which
the compiler vectorises) or ``"textbook"`` (one dot product per output element); README.md has
the napkin maths. The course's own two declarations, ``forward(input, weight)`` and
``backward(grad_output, input, weights)``, are bound too, with the default order.
What changed since stage 04: ``Layer(..., loop_order=...)`` and ``Function.apply(...,
loop_order)`` pass the loop order down to C++; ``Layer`` refuses an unknown order when it is
built and shows its order in its repr; everything else here is stage 04's.
Run it: ``pip install --no-build-isolation .`` here, then ``pytest tests``.
"""

import math

import torch

from . import _C  # the compiled FunctionCpp.cpp; import torch first: _C links against libtorch


class Function(torch.autograd.Function):
    """y = x W^T + b as C++ loops. Call it as Function.apply(input, weight, bias, loop_order)."""

    @staticmethod
    def forward(ctx, input, weight, bias=None, loop_order=_C.LOOP_ORDERS[0]):
        needs_input, needs_weight = ctx.needs_input_grad[:2]
        # Save only what the requested gradients need: grad_input needs W, grad_weight needs x.
        ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)
        ctx.loop_order = loop_order  # the backward's products use the forward's loop order
        # C++ checks the inputs, then computes x W^T + b for any leading dimensions.
        return _C.forward(input, weight, bias, loop_order)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        return Function.backward_once(ctx, grad_output, input, weight)

    # Raw-pointer C++ runs outside autograd, so its gradients cannot be differentiated again. The decorator
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
        grad_input, grad_weight, grad_bias = _C.backward(
            grad_output, input, weight, needs_input, needs_weight, needs_bias, ctx.loop_order
        )
        # One gradient per forward argument: input, weight, bias, loop_order (never one).
        return grad_input, grad_weight, grad_bias, None


class Layer(torch.nn.Module):
    """y = x W^T + b for an input of shape (*, in_features): a drop-in for torch.nn.Linear.

    ``loop_order`` picks the C++ loops: ``"cache_aware"`` (default) or ``"textbook"``.
    """

    def __init__(self, in_features: int = None, out_features: int = None, bias: bool = True, device=None, dtype=None,
                 *, loop_order: str = _C.LOOP_ORDERS[0], i_n_features_input: int = None, i_n_features_output: int = None):
        super().__init__()
        if loop_order not in _C.LOOP_ORDERS:  # C++ checks it too; this says so at construction
            raise ValueError(f"linear_cpp_naive: expected loop_order in {_C.LOOP_ORDERS}, got {loop_order!r}")
        # nn.Linear's argument names, or the course's (i_n_features_input, i_n_features_output).
        in_features = in_features if i_n_features_input is None else i_n_features_input
        out_features = out_features if i_n_features_output is None else i_n_features_output
        if in_features is None or out_features is None:
            raise TypeError(f"Layer() needs in_features and out_features, got {in_features} and {out_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.loop_order = loop_order
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
        return Function.apply(input, self.weight, self.bias, self.loop_order)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"loop_order={self.loop_order!r}")
