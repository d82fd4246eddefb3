"""Stage 06: the forward and backward pass in C++ (src/FunctionCpp.cpp and its headers), the products by LIBXSMM's JIT kernels.

What this stage teaches: how a fast matrix product is built from small JIT-generated kernels
(TPPs, tensor processing primitives) and the loop nest around them, and how a layer keeps
state in C++: each Layer owns a ``_C.LinearState`` made in its constructor, which holds the
kernels LIBXSMM generated for it, one plan per batch size, and the weight packed for the
forward. Function passes it to both passes:

    _C.LinearState(in_features, out_features)        kernels dispatched up front (README)
    _C.forward(input, weight, bias, state,           y = x W^T + b, bias may be None
               cache_weight)                           cache_weight: may reuse the packed W
    _C.backward(grad_output, input, weight,          [grad_input, grad_weight, grad_bias],
                need_input, need_weight, need_bias,    None for each one not asked for
                state)

The course's own two declarations, ``forward(input, weight)`` and
``backward(grad_output, input, weights)``, are bound too, with a temporary state.
What changed since stage 05: ``Layer`` makes a ``LinearState`` (``self.state``) instead of
taking a loop order, and ``Function.apply(input, weight, bias, state, cache_weight)`` passes
it down to C++; ``peak_gflops()`` measures what the machine can do at best.
Run it: ``pip install --no-build-isolation .`` here (LIBXSMM needed: README), then ``pytest tests``.
"""

import math

import torch

from . import _C  # the compiled src/FunctionCpp.cpp and src/bindings.cpp; import torch first: _C links against libtorch


class Function(torch.autograd.Function):
    """y = x W^T + b on LIBXSMM kernels. Call it as Function.apply(input, weight, bias, state, cache_weight).

    ``state``: a ``_C.LinearState(in_features, out_features)``, or None for a temporary one.
    ``cache_weight``: True when no gradient is recorded for the weight in this call; then the
    weight packed by an earlier call is reused while the weight is unchanged (README: the pack cache).
    """

    @staticmethod
    def forward(ctx, input, weight, bias=None, state=None, cache_weight=False):
        needs_input, needs_weight = ctx.needs_input_grad[:2]
        # Save only what the requested gradients need: grad_input needs W, grad_weight needs x.
        ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)
        ctx.state = state  # the backward's plans and kernels live there too; this keeps it alive
        # C++ checks the inputs, then the state, then computes x W^T + b for any leading dimensions.
        return _C.forward(input, weight, bias, state, cache_weight)

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
            grad_output, input, weight, needs_input, needs_weight, needs_bias, ctx.state
        )
        # One gradient per forward argument: input, weight, bias, state and cache_weight (never one).
        return grad_input, grad_weight, grad_bias, None, None


class Layer(torch.nn.Module):
    """y = x W^T + b for an input of shape (*, in_features): a drop-in for torch.nn.Linear.

    ``self.state`` is the layer's C++ state (``_C.LinearState``): its JIT kernels, plans and
    packed weight. pybind11 owns it; it is freed with the layer.
    """

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
        # Allocates the state and generates the kernels that do not depend on the batch size.
        self.state = _C.LinearState(in_features, out_features)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The same initialisation as torch.nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) for both.
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # Reuse the packed weight only when this call records no gradient for the weight
        # (inference under no_grad, or a frozen weight). In training the optimizer changes W
        # every step anyway, and gradcheck perturbs W through .data, unseen by the cache's key.
        cache_weight = not (torch.is_grad_enabled() and self.weight.requires_grad)
        return Function.apply(input, self.weight, self.bias, self.state, cache_weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def peak_gflops(repeats: int = 3, seconds: float = 0.1) -> float:
    """The machine's practical float32 peak in GFLOP/s, on torch.get_num_threads() threads.

    Every thread runs LIBXSMM's 64 x 64 x 64 kernel over and over on its own 48 KB of buffers
    (A in L1, B and C in L1/L2; no loop nest, no traffic beyond the core's caches): a practical
    peak, which deeper kernels can match or pass slightly. Best of ``repeats`` probes
    of ``seconds`` each, since a probe that overlapped other work reads low, never high.
    """
    _C.peak_gflops(seconds=0.01)  # warm-up: generate the kernel, wake the cores
    return max(_C.peak_gflops(64, 64, 64, seconds) for _ in range(repeats))
