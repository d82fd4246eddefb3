"""Stage 10: the LLTM cell in C++ on ATen, the tutorial's lltm.cpp in today's API.

What this stage teaches: how stage 09's hand-written forward and backward move to a C++
extension, and what that buys. lltm.py keeps stage 09's interface (LLTM and LLTMFunction);
their work is done by the compiled module ``_C``, built by setup.py from lltm.cpp (or JIT by
jit.py), with the two functions stage 09 wrote in Python:

    _C.forward(input, weights, bias, old_h, old_cell)
        -> new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights
    _C.backward(grad_h, grad_cell, new_cell, input_gate, output_gate, candidate_cell,
                X, gate_weights, weights)
        -> d_old_h, d_input, d_weights, d_bias, d_old_cell

What changed since stage 09: check_inputs, the derivatives, forward and backward left this
file for lltm.cpp (the checks are TORCH_CHECKs there: one place); the module now calls
LLTMFunction, so that lltm.cpp's hand-written backward runs (autograd would otherwise trace the
ATen calls of _C.forward op by op). The answer to "is it faster?" is in the
README: C++ removes the interpreter between the ops, not the ops.

Run it: ``pip install --no-build-isolation .`` here, then ``pytest tests``; the CPU benchmark
of every installed LLTM stage (09-11, 17; 12 has its own): ``python -m eml.common.lltm_bench``.
"""

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
        new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights = outputs
        ctx.bias_shape = bias.shape  # the bias gradient goes back in the bias's own shape
        ctx.save_for_backward(new_cell, input_gate, output_gate, candidate_cell, X, gate_weights, weights)
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
        d_old_h, d_input, d_weights, d_bias, d_old_cell = _C.backward(grad_h.contiguous(), grad_cell.contiguous(), *saved)
        needs = ctx.needs_input_grad  # one flag per forward argument
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
        # The Function runs the C++ forward and its hand-written backward: autograd records neither.
        return LLTMFunction.apply(input, self.weights, self.bias, old_h, old_cell)

    def extra_repr(self):
        return f"input_features={self.input_features}, state_size={self.state_size}"

