"""Stage 09: the LLTM cell in Python, this tutorial's second running example (its first lesson: fusion).

What this stage teaches: a recurrent cell made of one matrix product and a handful of
element-wise operations, written twice in Python:

    LLTM          an nn.Module whose forward is torch ops; autograd records them and does the
                  backward (one backward node per op: the cost stages 10 and 11 attack)
    LLTMFunction  a torch.autograd.Function with the backward written by hand, from the
                  derivatives d_sigmoid, d_tanh and d_elu; the signature stage 10's C++ keeps:

    forward(input, weights, bias, old_h, old_cell)
        -> new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights
    backward(grad_h, grad_cell, new_cell, input_gate, output_gate, candidate_cell,
             X, gate_weights, weights)
        -> d_old_h, d_input, d_weights, d_bias, d_old_cell

What changed since the linear stages: a new example. The cell (for B rows, F features, state S):

    X = [old_h, input]                           (B, S + F)
    gates = X W^T + b                            W: (3S, S + F), b: (3S) or (1, 3S)
    input_gate, output_gate = sigmoid(gates[:, :S]), sigmoid(gates[:, S:2S])
    candidate_cell = elu(gates[:, 2S:])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = tanh(new_cell) * output_gate

Run it: ``pip install --no-build-isolation .`` here, then ``pytest tests``; the CPU benchmark
of every installed LLTM stage (09-11, 17; 12 has its own): ``python -m eml.common.lltm_bench``.
"""

import math

import torch
import torch.nn.functional as F


# ---- 1. The checks: one place, called by both the module and the Function ----

def check_inputs(input, weights, bias, old_h, old_cell):
    """Raise a clear error for anything the cell cannot take; the message names the value."""
    tensors = {"input": input, "weights": weights, "bias": bias, "old_h": old_h, "old_cell": old_cell}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"lltm_python: {name} must be a tensor, got {type(tensor).__name__}")
        if tensor.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"lltm_python: {name} must be float32 or float64, got {tensor.dtype}")
    for name, tensor in tensors.items():
        if tensor.dtype != input.dtype:
            raise TypeError(f"lltm_python: {name} is {tensor.dtype} but input is {input.dtype}")
        if tensor.device != input.device:
            raise ValueError(f"lltm_python: {name} is on {tensor.device} but input is on {input.device}")
    if input.dim() != 2:
        raise ValueError(f"lltm_python: input must be 2-D (batch, features), got shape {list(input.shape)}")
    if weights.dim() != 2 or weights.shape[0] % 3 != 0:
        raise ValueError(f"lltm_python: weights must be 2-D (3 * state, state + features), got shape {list(weights.shape)}")
    batch, features = input.shape
    state = weights.shape[0] // 3
    for name, tensor in (("old_h", old_h), ("old_cell", old_cell)):
        if tensor.dim() != 2:
            raise ValueError(f"lltm_python: {name} must be 2-D (batch, state), got shape {list(tensor.shape)}")
        if tensor.shape[0] != batch:
            raise ValueError(f"lltm_python: {name} has batch size {tensor.shape[0]} but input has {batch}")
        if tensor.shape[1] != state:
            raise ValueError(f"lltm_python: {name} must have shape [{batch}, {state}] (weights have 3 * {state} rows), "
                             f"got {list(tensor.shape)}")
    if weights.shape[1] != state + features:
        raise ValueError(f"lltm_python: input has {features} features, so weights must have shape "
                         f"[{3 * state}, {state + features}], got {list(weights.shape)}")
    if tuple(bias.shape) not in ((3 * state,), (1, 3 * state)):
        raise ValueError(f"lltm_python: bias must have shape ({3 * state}) or (1, {3 * state}), got {list(bias.shape)}")


# ---- 2. The derivatives, one line each ----

def d_sigmoid(z):
    s = torch.sigmoid(z)
    return (1 - s) * s  # sigmoid'(z) = sigmoid(z) (1 - sigmoid(z))


def d_tanh(z):
    return 1 - z.tanh().pow(2)  # tanh'(z) = 1 - tanh^2(z)


def d_elu(z, alpha=1.0):
    return torch.where(z > 0, torch.ones_like(z), alpha * z.exp())  # elu'(z) = 1 if z > 0 else alpha e^z


# ---- 3. Forward and backward: the two functions stage 10 writes in C++ ----

def forward(input, weights, bias, old_h, old_cell):
    check_inputs(input, weights, bias, old_h, old_cell)
    X = torch.cat([old_h, input], dim=1)
    gate_weights = F.linear(X, weights, bias.reshape(-1))
    gates = gate_weights.chunk(3, dim=1)  # (B, S) each: input, output, candidate
    input_gate = torch.sigmoid(gates[0])
    output_gate = torch.sigmoid(gates[1])
    candidate_cell = F.elu(gates[2])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    return new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights


def backward(grad_h, grad_cell, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights, weights):
    state = new_cell.shape[1]
    d_output_gate = torch.tanh(new_cell) * grad_h
    d_tanh_new_cell = output_gate * grad_h
    d_new_cell = d_tanh(new_cell) * d_tanh_new_cell + grad_cell

    d_old_cell = d_new_cell
    d_candidate_cell = input_gate * d_new_cell
    d_input_gate = candidate_cell * d_new_cell

    gates = gate_weights.chunk(3, dim=1)
    d_input_gate = d_input_gate * d_sigmoid(gates[0])
    d_output_gate = d_output_gate * d_sigmoid(gates[1])
    d_candidate_cell = d_candidate_cell * d_elu(gates[2])
    d_gates = torch.cat([d_input_gate, d_output_gate, d_candidate_cell], dim=1)

    d_weights = d_gates.t().mm(X)
    d_bias = d_gates.sum(dim=0, keepdim=True)  # (1, 3S), as the tutorial's C++

    d_X = d_gates.mm(weights)
    d_old_h = d_X[:, :state]  # X = [old_h, input]: the first S columns belong to old_h, the
    d_input = d_X[:, state:]  # rest (F of them, F != S in general) to the input
    return d_old_h, d_input, d_weights, d_bias, d_old_cell


# ---- 4. The autograd.Function and the module ----

class LLTMFunction(torch.autograd.Function):
    """The LLTM cell with a hand-written backward: LLTMFunction.apply(input, weights, bias,
    old_h, old_cell) returns (new_h, new_cell)."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        outputs = forward(input, weights, bias, old_h, old_cell)
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
        d_old_h, d_input, d_weights, d_bias, d_old_cell = backward(grad_h.contiguous(), grad_cell.contiguous(), *saved)
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
        # Plain torch ops under autograd: it records each one and differentiates them for us.
        new_h, new_cell = forward(input, self.weights, self.bias, old_h, old_cell)[:2]
        return new_h, new_cell

    def extra_repr(self):
        return f"input_features={self.input_features}, state_size={self.state_size}"


class LLTMWithFunction(LLTM):
    """The same module, its backward by hand: forward calls LLTMFunction (stage 10's module)."""

    def forward(self, input, state):
        old_h, old_cell = state
        return LLTMFunction.apply(input, self.weights, self.bias, old_h, old_cell)


def compiled_lltm(input_features, state_size):
    """LLTM under torch.compile (inductor, default options): what a user who writes no C++ gets,
    the baseline the C++ stages must beat. Module.compile() compiles in place, so the module keeps
    LLTM's parameters and state_dict keys; the first call of each new shape or dtype compiles."""
    cell = LLTM(input_features, state_size)
    cell.compile()
    return cell
