"""Stage 17: the fused LLTM cell of stage 11, its GEMMs on LIBXSMM's JIT kernels.

What this stage teaches: once the element-wise work is fused, the GEMMs and the calls around
them are the step. lltm.py is stage 11's (LLTM, LLTMFunction, and the module's one call per
step, _C.cell) plus floor_cell; the compiled module ``_C`` (lltm.cpp) runs the forward's GEMM
and the backward's two on LIBXSMM's kernels, a few calls per thread over blocks (no cat of
X = [old_h, input]), around 11's fused passes:

    _C.cell(input, weights, bias, old_h, old_cell) -> new_h, new_cell
    _C.forward(input, weights, bias, old_h, old_cell) -> new_h, new_cell, gates
    _C.backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights,
                need_d_X, need_d_weights)
        -> d_old_h, d_input, d_weights, d_bias, d_old_cell

What changed since stage 11: in this file, this docstring and floor_cell (the LLTM benchmark's
floor for a C++ node); lltm.cpp's section 3c, and its nothing_cell.

Run it: ``pip install --no-build-isolation .`` here (LIBXSMM 1.17 first: README), then ``pytest
tests``; the CPU benchmark of every installed LLTM stage (09-11, 17; 12 has its own): ``python -m
eml.common.lltm_bench``."""

import math

import torch

from . import _C  # the compiled lltm.cpp; import torch first: _C links against libtorch


# ---- 1. The autograd.Function and the module ----

class LLTMFunction(torch.autograd.Function):
    """The LLTM cell with a hand-written backward: LLTMFunction.apply(input, weights, bias,
    old_h, old_cell) returns (new_h, new_cell)."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        outputs = _C.forward(input, weights, bias, old_h, old_cell)  # C++ checks the inputs
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
        d_old_h, d_input, d_weights, d_bias, d_old_cell = _C.backward(
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
    returns (new_h, new_cell)."""

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
        # LLTMFunction's recipe as one C++ autograd node (lltm.cpp, section 6): one call per step,
        # and a backward that never enters Python.
        new_h, new_cell = _C.cell(input, self.weights, self.bias, old_h, old_cell)
        return new_h, new_cell

    def extra_repr(self):
        return f"input_features={self.input_features}, state_size={self.state_size}"


def floor_cell(input_features, state_size):
    """Not an LLTM: the LLTM benchmark's FloorCell on _C.nothing_cell, a C++ autograd node that
    computes nothing (lltm.cpp, section 6). ``python -m eml.common.lltm_bench --floor`` times it
    beside LLTM: what a step costs around the arithmetic of a cell whose node is C++."""
    from eml.common.lltm_bench import FloorCell  # the benchmark's package, needed only to time
    return FloorCell(input_features, state_size, node=_C.nothing_cell)

