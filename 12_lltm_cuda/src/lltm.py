"""Stage 12: the LLTM cell on a GPU, stage 11's fused passes as two CUDA kernels.

What this stage teaches: moving a fused CPU pass to a GPU. lltm.py keeps stage 11's interface
and its two lessons (save only the pre-activation gates, skip the GEMMs nobody asked for); the
compiled module ``_C`` is built from lltm_cuda.cpp (checks, cuBLAS GEMMs, binding) and
lltm_cuda_kernel.cu (one forward kernel, one backward kernel in place of 11's row loops):

    _C.cell(input, weights, bias, old_h, old_cell) -> new_h, new_cell
    _C.forward(input, weights, bias, old_h, old_cell) -> new_h, new_cell, gates
    _C.backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights,
                need_d_X, need_d_weights)
        -> d_old_h, d_input, d_weights, d_bias, d_old_cell

What changed since stage 11: every tensor must live on one CUDA device, and this module imports
without the compiled ``_C`` (a CPU-only torch cannot build it): the module, its parameters and
``LLTMFunction`` exist everywhere, and only running the cell raises a clear "needs CUDA" error.

Run it: ``pip install --no-build-isolation ./12_lltm_cuda`` on a machine with a GPU and a CUDA
build of torch, then ``pytest 12_lltm_cuda/tests``; the benchmark of every cell that runs on
the GPU: ``python 12_lltm_cuda/benchmark.py``.
"""

import math

import torch

try:
    from . import _C  # the compiled lltm_cuda.cpp + lltm_cuda_kernel.cu; import torch first
except ImportError as error:  # not built: a CPU-only torch, or the source folder imported as is
    _C = None
    _IMPORT_ERROR = error


# ---- 1. The compiled module, or why it is missing ----

def _extension():
    """The compiled module, or a RuntimeError that says why it is missing and what to do."""
    if _C is not None:
        return _C
    if torch.version.cuda is None:
        why = f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    elif not torch.cuda.is_available():
        why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"
    else:
        why = f"its compiled module eml.lltm_cuda._C is not built or does not load ({_IMPORT_ERROR})"
    raise RuntimeError(
        f"eml.lltm_cuda needs CUDA: {why}. Build it on a GPU machine with a CUDA build of torch: "
        "pip install --no-build-isolation ./12_lltm_cuda (stages 09-11 run the same cell on the CPU)"
    )


# ---- 2. The autograd.Function and the module ----

class LLTMFunction(torch.autograd.Function):
    """The LLTM cell with a hand-written backward: LLTMFunction.apply(input, weights, bias,
    old_h, old_cell) returns (new_h, new_cell), all tensors on one CUDA device."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        outputs = _extension().forward(input, weights, bias, old_h, old_cell)  # C++ checks the inputs
        new_h, new_cell, gates = outputs
        ctx.bias_shape = bias.shape  # the bias gradient goes back in the bias's own shape
        # Only gates (B, 3S) is new memory: the rest exists anyway (inputs, the output new_cell).
        ctx.save_for_backward(new_cell, gates, input, old_h, weights)
        return new_h, new_cell

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        # Saved tensors are passed as arguments: once_differentiable decides from its arguments
        # whether a second backward could be asked for (grad_h alone is often a constant).
        return LLTMFunction.backward_once(ctx, grad_h, grad_cell, *ctx.saved_tensors)

    # The backward above uses the gates saved by forward, which autograd did not record: its
    # result cannot be differentiated again. The decorator makes a second backward
    # (create_graph=True) raise instead of silently returning wrong second derivatives.
    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward_once(ctx, grad_h, grad_cell, *saved):
        needs = ctx.needs_input_grad  # one flag per forward argument
        need_d_X, need_d_weights = needs[0] or needs[3], needs[1]  # C++ skips the GEMMs nobody asked for
        d_old_h, d_input, d_weights, d_bias, d_old_cell = _extension().backward(
            grad_h.contiguous(), grad_cell.contiguous(), *saved, need_d_X, need_d_weights)
        return (
            d_input if needs[0] else None,
            d_weights if needs[1] else None,
            d_bias.reshape(ctx.bias_shape) if needs[2] else None,
            d_old_h if needs[3] else None,
            d_old_cell if needs[4] else None,
        )


class LLTM(torch.nn.Module):
    """The LLTM cell of PyTorch's C++/CUDA extension tutorial: forward(input, (old_h, old_cell))
    returns (new_h, new_cell). Put it on the GPU with .cuda() (or device="cuda")."""

    def __init__(self, input_features, state_size, device=None, dtype=None):
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        factory = {"device": device, "dtype": dtype}
        # gates = [old_h, input] W^T + b: three blocks of S rows (input, output, candidate).
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size, **factory))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size, **factory))
        self.reset_parameters()

    def reset_parameters(self):
        # The tutorial's initialisation: U(-1/sqrt(S), 1/sqrt(S)) for every parameter.
        stdv = 1.0 / math.sqrt(self.state_size) if self.state_size > 0 else 0.0
        for weight in self.parameters():
            weight.data.uniform_(-stdv, +stdv)

    def forward(self, input, state):
        old_h, old_cell = state
        # LLTMFunction's recipe as one C++ autograd node (lltm_cuda.cpp, section 6): one call per
        # step, and a backward that never enters Python.
        new_h, new_cell = _extension().cell(input, self.weights, self.bias, old_h, old_cell)
        return new_h, new_cell

    def extra_repr(self):
        return f"input_features={self.input_features}, state_size={self.state_size}"

