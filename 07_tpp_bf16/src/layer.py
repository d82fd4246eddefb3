"""Stage 07: the linear layer in bfloat16 on LIBXSMM's VNNI kernels, and mixed precision like torch.nn.Linear.

What this stage teaches: bfloat16 compute with fp32 accumulation and one rounding, the VNNI-2
layout the bf16 kernels read (README, vnni_gemm.h), the float32 path chosen at run time where
the CPU's bf16 kernels are not native (emulated or missing), and ``torch.autocast`` the way ``torch.nn.Linear`` meets it. The C++
interface is stage 06's, and it now takes bfloat16 tensors too:

    _C.LinearState(in_features, out_features)        kernels dispatched up front (06's README)
    state.bf16_path                                   "vnni" (LIBXSMM bf16 kernels), "reference"
                                                        (same packing, plain C++ kernel), "fp32"
                                                        (fallback: fp32 kernels, one rounding)
    _C.forward(input, weight, bias, state,           y = x W^T + b, bias may be None;
               cache_weight)                           float32, float64 or bfloat16
    _C.backward(grad_output, input, weight,          [grad_input, grad_weight, grad_bias],
                need_input, need_weight, need_bias,    None for each one not asked for
                state)
    _C.bf16_kernels_available(), _C.bf16_kernels_native(), _C.pack_vnni2(a, bm), _C.peak_gflops_bf16()

What changed since stage 06: ``Layer.forward`` follows ``torch.autocast("cpu", dtype=torch.bfloat16)``
as nn.Linear does (float32 operands cast to bf16 before the Function; autograd returns float32
gradients through the casts); ``Layer.bf16_path`` says how this layer computes bf16;
``bf16_path()`` and ``peak_gflops_bf16()`` are new.
Run it: ``pip install --no-build-isolation .`` here (LIBXSMM needed: README), then ``pytest tests``.
"""

import math

import torch

from . import _C  # the compiled src/FunctionCpp.cpp and src/bindings.cpp; import torch first: _C links against libtorch


class Function(torch.autograd.Function):
    """y = x W^T + b on LIBXSMM kernels. Call it as Function.apply(input, weight, bias, state, cache_weight).

    ``state``: a ``_C.LinearState(in_features, out_features)``, or None for a temporary one.
    ``cache_weight``: True when no gradient is recorded for the weight in this call; then the
    weight packed by an earlier call is reused while the weight is unchanged (06's README: the pack cache).
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


def autocast_operands(input, weight, bias):
    """What CPU autocast does to nn.Linear's operands: every floating tensor but float64 cast to
    the autocast dtype (a float64 one stays, and then the dtypes disagree, as with nn.Linear)."""
    dtype = torch.get_autocast_dtype("cpu")
    if dtype != torch.bfloat16:
        raise TypeError(f"linear_tpp_bf16: autocast to {dtype} is not supported on this layer, only torch.bfloat16")

    def cast(tensor):
        eligible = tensor is not None and tensor.is_floating_point() and tensor.dtype != torch.float64
        return tensor.to(dtype) if eligible else tensor

    return cast(input), cast(weight), cast(bias)


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
        weight, bias = self.weight, self.bias
        if torch.is_autocast_enabled("cpu"):
            # New: as nn.Linear under autocast. The bf16 copies are new tensors every call, so
            # there is nothing to cache; their gradients flow back through .to() as float32.
            input, weight, bias = autocast_operands(input, weight, bias)
            cache_weight = False
        return Function.apply(input, weight, bias, self.state, cache_weight)

    @property
    def bf16_path(self) -> str:
        """How this layer computes bfloat16: "vnni", "reference" or "fp32" (settable; README)."""
        return self.state.bf16_path

    @bf16_path.setter
    def bf16_path(self, path: str) -> None:
        self.state.bf16_path = path

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


def bf16_path() -> str:
    """The bf16 path a new Layer takes on this CPU: "vnni" where LIBXSMM's bf16 kernels run
    natively (AVX512-BF16), else "fp32" (fp32 kernels, one rounding). On other AVX-512 CPUs the
    bf16 kernels exist but are emulated, slower than fp32: ``layer.bf16_path = "vnni"`` still
    selects them there."""
    return "vnni" if _C.bf16_kernels_native() else "fp32"


def peak_gflops_bf16(repeats: int = 3, seconds: float = 0.1):
    """The machine's practical bfloat16 peak in GFLOP/s (LIBXSMM's bf16 64 x 64 x 64 kernel in
    cache on every thread), or None where this CPU gets no bf16 kernels."""
    if not _C.bf16_kernels_available():
        return None
    _C.peak_gflops_bf16(seconds=0.01)  # warm-up: generate the kernel, wake the cores
    return max(_C.peak_gflops_bf16(64, 64, 64, seconds) for _ in range(repeats))
