"""Stage 16: the Python half of the registered operators torch.ops.eml_stable.* (the C++ half:
bindings.cpp, on LibTorch's stable ABI).

This file is stage 08's ops.py for the namespace eml_stable: a C++ kernel becomes a real PyTorch
operator when the dispatcher knows its schema (C++, STABLE_TORCH_LIBRARY) and, beside the CPU
kernel, four small rules registered here:

    register_fake       shapes and dtypes without computing: torch.compile and torch.export
                        trace the op with fake tensors, and the meta device uses it
    register_autograd   the backward, from the same ops: only the gradients needs_input_grad
                        asks for, and each backward op has a backward of its own (double backward)
    register_autocast   under torch.autocast("cpu") the op computes in bfloat16, as nn.Linear does
    register_vmap       torch.func.vmap: a batch of inputs on one weight, or stacked weights

None of them is C++, so the stable ABI changes nothing here. What is new: bindings.cpp names this
module with m.set_python_module (torch 2.13 records it and cites it in its errors), and imports it
itself when the library is loaded by path with ``torch.ops.load_library`` (README, "Loading by
path").

The ops (all functional: no argument is written to or aliased):

    eml_stable::linear(input, weight, bias?)          y  = x W^T + b      (*, in) -> (*, out)
    eml_stable::linear_grad_input(grad_output, weight) gx = gy W          (*, out) -> (*, in)
    eml_stable::linear_grad_weight(grad_output, input) gw = gy^T x        -> (out, in)
    eml_stable::linear_grad_bias(grad_output)          gb = sum of gy rows -> (out)

``forward`` and ``backward`` below are the course's two functions, on top of the ops.
What changed since stage 08: the namespace and the stage's name (the two constants below), and
``_C`` is imported only when the ops are not registered yet (loading by path).
Run it: ``pip install --no-build-isolation .`` in 16_stable_abi/, then ``pytest tests``.
"""

import torch

STAGE = "linear_stable"  # the first word of every message, as the C++ kStage
NAMESPACE = "eml_stable"  # the ops' namespace: torch.ops.eml_stable.linear is "eml_stable::linear" to torch.library
ops = getattr(torch.ops, NAMESPACE)

# Loading _C.abi3.so runs STABLE_TORCH_LIBRARY: torch.ops.eml_stable.* exist from there on. New in
# 16: unless they exist already, because the library was loaded by path (torch.ops.load_library)
# and is importing this module itself (bindings.cpp, section 5); a second copy would register twice.
if not hasattr(ops, "linear"):
    from . import _C  # noqa: F401

# LIBXSMM 1.17's GEMM flags (libxsmm_typedefs.h), for ops.tpp_dispatch_check.
FLAG_TRANS_A, FLAG_TRANS_B, FLAG_BETA_0 = 1, 2, 16


# ---- 1. The course's two functions, on the ops ----------------------------------------------
def forward(input, weight, bias=None):
    """y = x W^T (+ b) for x of shape (*, in_features): the op itself."""
    return ops.linear(input, weight, bias)


def backward(grad_output, input, weights, *needs):
    """The course's ``backward(grad_output, input, weights)`` -> [grad_input, grad_weight], or, with
    three flags (need_grad_input, need_grad_weights, need_grad_bias), [grad_input, grad_weight,
    grad_bias] with None for each one not asked for. Calls only the ops that are needed;
    ``input`` (``weights``) may be None when grad_weight (grad_input) is not asked for."""
    need_input, need_weights, need_bias = needs or (True, True, False)
    if need_input and weights is None:
        raise ValueError(f"{STAGE}: grad_input needs the weight, got None")
    if need_weights and input is None:
        raise ValueError(f"{STAGE}: grad_weight needs the input, got None")
    grads = [
        ops.linear_grad_input(grad_output, weights) if need_input else None,
        ops.linear_grad_weight(grad_output, input) if need_weights else None,
        ops.linear_grad_bias(grad_output) if need_bias else None,
    ]
    return grads if needs else grads[:2]


# ---- 2. Fake kernels: what comes out, for tensors that hold no data ---------------------------
# torch.compile and torch.export run the op on FakeTensors (shapes, dtypes, devices, maybe
# symbolic sizes) to learn its output without computing it; the meta device runs the same
# function. It must agree with the CPU kernel: opcheck's test_faketensor compares the two.
# The checks raise the C++ kernel's messages at trace time, where the C++ never runs.
def _check(condition, message):
    torch._check(condition, lambda: f"{STAGE}: {message}")


def _check_like_weight(weight, **tensors):
    for name, tensor in tensors.items():
        _check(tensor.device == weight.device, f"expected the {name} on the weight's device {weight.device}, got device {tensor.device}")
        _check(tensor.dtype == weight.dtype, f"expected the {name} dtype {weight.dtype} (the weight's), got {tensor.dtype}")


@torch.library.register_fake(f"{NAMESPACE}::linear")
def _linear_fake(input, weight, bias):
    _check(weight.dim() == 2, f"expected a 2-d weight (out_features, in_features), got {weight.dim()} dimension(s)")
    _check(input.dim() >= 1, "expected an input with at least 1 dimension (*, in_features), got a 0-d tensor")
    _check_like_weight(weight, input=input, **({"bias": bias} if bias is not None else {}))
    _check(input.shape[-1] == weight.shape[1],
           f"expected {weight.shape[1]} input features in the last dimension (the weight's in_features), got {input.shape[-1]}")
    if bias is not None:
        _check(bias.dim() == 1 and bias.shape[0] == weight.shape[0],
               f"expected a bias of shape [{weight.shape[0]}] (the weight's out_features), got shape {list(bias.shape)}")
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


@torch.library.register_fake(f"{NAMESPACE}::linear_grad_input")
def _linear_grad_input_fake(grad_output, weight):
    _check_like_weight(weight, grad_output=grad_output)
    _check(grad_output.shape[-1] == weight.shape[0], f"expected {weight.shape[0]} output features in grad_output, got {grad_output.shape[-1]}")
    return grad_output.new_empty((*grad_output.shape[:-1], weight.shape[1]))


@torch.library.register_fake(f"{NAMESPACE}::linear_grad_weight")
def _linear_grad_weight_fake(grad_output, input):
    _check(grad_output.shape[:-1] == input.shape[:-1], f"expected grad_output's leading dimensions {list(input.shape[:-1])} (the input's), got {list(grad_output.shape[:-1])}")
    return grad_output.new_empty((grad_output.shape[-1], input.shape[-1]))


@torch.library.register_fake(f"{NAMESPACE}::linear_grad_bias")
def _linear_grad_bias_fake(grad_output):
    return grad_output.new_empty((grad_output.shape[-1],))


# ---- 3. Autograd: the backward of every op, made of the ops ----------------------------------
# setup_context saves what the backward needs; backward returns one gradient per op argument and
# computes only those ctx.needs_input_grad asks for. Since every backward is built from ops
# that have a backward of their own, gradients of gradients work too (06 refused them).
def _linear_setup_context(ctx, inputs, output):
    input, weight, _ = inputs
    # needs_input_grad: one flag per op argument (register_autograd may append one of its own).
    needs_input, needs_weight = ctx.needs_input_grad[:2]
    # Save only what the requested gradients need: grad_input needs W, grad_weight needs x.
    ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)


def _linear_backward(ctx, grad_output):
    input, weight = ctx.saved_tensors
    return tuple(backward(grad_output, input, weight, *ctx.needs_input_grad[:3]))


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


# grad_input = gy W: d/d gy (g) = g W^T = linear(g, W);  d/dW (g) = gy^T g = grad_weight(gy, g).
def _linear_grad_input_backward(ctx, grad):
    grad_output, weight = ctx.saved_tensors
    need_gy, need_w = ctx.needs_input_grad[:2]
    return (ops.linear(grad, weight, None) if need_gy else None,
            ops.linear_grad_weight(grad_output, grad) if need_w else None)


# grad_weight = gy^T x: d/d gy (G) = x G^T = linear(x, G);  d/dx (G) = gy G = grad_input(gy, G).
def _linear_grad_weight_backward(ctx, grad):
    grad_output, input = ctx.saved_tensors
    need_gy, need_x = ctx.needs_input_grad[:2]
    return (ops.linear(input, grad, None) if need_gy else None,
            ops.linear_grad_input(grad_output, grad) if need_x else None)


# grad_bias = sum of gy's rows: d/d gy (g) = g in every row.
def _linear_grad_bias_setup_context(ctx, inputs, output):
    ctx.shape = inputs[0].shape


def _linear_grad_bias_backward(ctx, grad):
    return grad.expand(ctx.shape)


torch.library.register_autograd(f"{NAMESPACE}::linear", _linear_backward, setup_context=_linear_setup_context)
torch.library.register_autograd(f"{NAMESPACE}::linear_grad_input", _linear_grad_input_backward,
                                setup_context=_save_inputs)
torch.library.register_autograd(f"{NAMESPACE}::linear_grad_weight", _linear_grad_weight_backward,
                                setup_context=_save_inputs)
torch.library.register_autograd(f"{NAMESPACE}::linear_grad_bias", _linear_grad_bias_backward,
                                setup_context=_linear_grad_bias_setup_context)


# ---- 4. Autocast: as nn.Linear under torch.autocast("cpu") -------------------------------------
# Inside torch.autocast("cpu") (bfloat16, its default), floating inputs are cast to bfloat16
# before the op runs: float32 parameters, a bfloat16 output, float32 gradients (the cast is
# differentiable). The backward ops need no rule: an op without an Autocast kernel falls through
# that key and runs in the dtype of the tensors it gets, here the bfloat16 ones saved by the
# forward, wherever backward() is called. (nn.Linear follows the autocast dtype; this op
# has no float16 kernel and computes in bfloat16 whatever dtype autocast names.)
torch.library.register_autocast(f"{NAMESPACE}::linear", "cpu", torch.bfloat16)


# ---- 5. vmap: batching rules -----------------------------------------------------------------
# torch.func.vmap calls a rule with in_dims (where each argument's batch dimension is, None when
# unbatched) and expects (output, where the output's batch dimension is).
def _linear_vmap(info, in_dims, input, weight, bias):
    input_dim, weight_dim, bias_dim = in_dims
    if weight_dim is None and bias_dim is None:
        # One weight for the whole batch: the vmapped dimension is one more leading dimension of
        # the input, which the op takes anyway. One call, no loop.
        return ops.linear(input.movedim(input_dim, 0), weight, bias), 0
    count = info.batch_size
    weights = weight.movedim(weight_dim, 0) if weight_dim is not None else weight.expand(count, *weight.shape)
    biases = None
    if bias is not None:
        biases = bias.movedim(bias_dim, 0) if bias_dim is not None else bias.expand(count, *bias.shape)
    if input_dim is None:
        # An ensemble on one input (torch.func.stack_module_state, in_dims=(0, 0, None)): the
        # members' weights stacked into one (count * out, in) weight, one call, then split.
        out_features = weights.shape[1]
        output = ops.linear(input, weights.reshape(-1, weights.shape[-1]),
                            None if biases is None else biases.reshape(-1))
        return output.unflatten(-1, (count, out_features)).movedim(-2, 0), 0
    # An ensemble on a batch of inputs, one per member: one call per member.
    inputs = input.movedim(input_dim, 0)
    outputs = [ops.linear(inputs[i], weights[i], None if biases is None else biases[i]) for i in range(count)]
    return torch.stack(outputs), 0


def _vmap_by_loop(op):
    """A batching rule for any op: one call per batch element (used by the backward ops)."""

    def rule(info, in_dims, *args):
        def element(i):
            return [arg if dim is None else arg.select(dim, i) for arg, dim in zip(args, in_dims)]

        return torch.stack([op(*element(i)) for i in range(info.batch_size)]), 0

    return rule


torch.library.register_vmap(f"{NAMESPACE}::linear", _linear_vmap)
for _name in ("linear_grad_input", "linear_grad_weight", "linear_grad_bias"):
    torch.library.register_vmap(f"{NAMESPACE}::{_name}", _vmap_by_loop(getattr(ops, _name)))
