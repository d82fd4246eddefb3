"""Stage 13: the C library of clib.py wrapped in autograd Functions and nn.Modules.

What this stage teaches: once C can be called on a tensor's memory (clib.py), the rest is the
contract of stage 02: a ``torch.autograd.Function`` whose forward calls C and whose backward
returns one gradient per input.

    AddFunction / AddModule     a + b; backward: grad_a = grad_b = grad_out, both from C
                                (the removed torch.utils.ffi example returned only one)
    LinearFunction / Layer      y = x W^T + b, a drop-in for torch.nn.Linear. The C library
                                has only a linear FORWARD; the backward reuses it:
        grad_input  = grad_out @ W    = linear(grad_out,   W^T)   (W^T made contiguous)
        grad_weight = grad_out^T @ x  = linear(grad_out^T, x^T)
        grad_bias   = grad_out summed over the rows (torch)

Because the backward is made of the differentiable LinearFunction itself, double backward
works too (gradgradcheck, tested). AddFunction's backward is a Function too
(AddBackwardFunction: C's gradients, and a backward that is the add again), for the same reason. Inputs are made contiguous here, once, and
passed to clib as they are (arguments stay alive until C returns); clib.py refuses anything C
cannot read.
What changed: a new route, not a copy of an earlier stage (README).
Run it: ``pip install --no-build-isolation .`` in 13_c_ffi, then ``pytest 13_c_ffi/tests``.
"""

from __future__ import annotations

import math

import torch

from . import clib


def check_linear_inputs(input, weight, bias) -> None:
    """What can be checked without memory (shapes, dtypes, devices): also run on FakeTensors (ops.py)."""
    for name, tensor in (("input", input), ("weight", weight), ("bias", bias)):
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise TypeError(f"c_ffi.linear: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if input.dim() == 0:
        raise ValueError("c_ffi.linear: expected an input with at least 1 dimension (*, in_features), got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(f"c_ffi.linear: weight must be 2-d (out_features, in_features), got {weight.dim()}-d shape {list(weight.shape)}")
    for name, tensor in (("input", input), ("weight", weight), ("bias", bias)):
        if tensor is not None and tensor.device.type != "cpu":
            raise ValueError(f"c_ffi.linear: {name} must be on the CPU (C reads host memory), got device {tensor.device}")
    if input.dtype not in clib.SUFFIX:
        raise TypeError(f"c_ffi.linear: input must have dtype torch.float32 or torch.float64, got dtype {input.dtype}")
    for name, tensor in (("weight", weight), ("bias", bias)):
        if tensor is not None and tensor.dtype != input.dtype:
            raise TypeError(f"c_ffi.linear: {name} must have the input's dtype {input.dtype}, got dtype {tensor.dtype}")
    if input.shape[-1] != weight.shape[1]:
        raise ValueError(f"c_ffi.linear: input has {input.shape[-1]} features in its last dimension, "
                         f"the weight expects {weight.shape[1]} in_features (input shape {list(input.shape)})")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"c_ffi.linear: bias must have shape [{weight.shape[0]}] (out_features), got {list(bias.shape)}")


def as_rows(tensor: torch.Tensor) -> torch.Tensor:
    """(*, n) -> (N, n), N the product of the leading dimensions (reshape(-1, n) fails when n == 0)."""
    return tensor.reshape(math.prod(tensor.shape[:-1]), tensor.shape[-1])


def check_add_inputs(a, b) -> None:
    """The add's shape/dtype/device checks that need no memory (also run on FakeTensors)."""
    for name, tensor in (("a", a), ("b", b)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"c_ffi.add: {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise ValueError(f"c_ffi.add: {name} must be on the CPU (C reads host memory), got device {tensor.device}")
        if tensor.dtype not in clib.SUFFIX:
            raise TypeError(f"c_ffi.add: {name} must have dtype torch.float32 or torch.float64, got dtype {tensor.dtype}")
    if a.dtype != b.dtype:
        raise TypeError(f"c_ffi.add: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.shape != b.shape:  # no broadcasting: C adds two arrays of n elements
        raise ValueError(f"c_ffi.add: a and b must have the same shape, got {list(a.shape)} and {list(b.shape)}")


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b in C, no autograd: any strides (made contiguous here), checked first."""
    check_add_inputs(a, b)
    a_contiguous, b_contiguous = a.contiguous(), b.contiguous()  # clib's arguments: alive until C returns
    return clib.add_forward(a_contiguous, b_contiguous)


def add_backward(grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    grad_out_contiguous = grad_out.contiguous()
    return clib.add_backward(grad_out_contiguous)


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b in C for an input of shape (*, in_features), no autograd."""
    check_linear_inputs(input, weight, bias)
    input_2d = as_rows(input).contiguous()  # every leading dimension is a row
    weight_contiguous = weight.contiguous()
    bias_contiguous = None if bias is None else bias.contiguous()
    output = clib.linear_forward(input_2d, weight_contiguous, bias_contiguous)
    return output.reshape(*input.shape[:-1], weight.shape[0])


class AddFunction(torch.autograd.Function):
    """a + b with both gradients from C. Call it as AddFunction.apply(a, b)."""

    @staticmethod
    def forward(ctx, a, b):
        return add(a, b)  # nothing to save: the gradient of a sum does not depend on a or b

    @staticmethod
    def backward(ctx, grad_output):
        needs_a, needs_b = ctx.needs_input_grad
        if not (needs_a or needs_b):
            return None, None
        grad_a, grad_b = AddBackwardFunction.apply(grad_output)  # from C, and differentiable
        return (grad_a if needs_a else None), (grad_b if needs_b else None)


class AddBackwardFunction(torch.autograd.Function):
    """The add's backward, (grad_a, grad_b) = (grad_out, grad_out) from C, as a Function of its own.
    C writes the gradients through pointers, where autograd cannot follow; called bare inside
    AddFunction.backward, a second derivative would silently leave out the add's part. As a
    Function it has a backward: the derivative of g -> (g, g) is the sum of the two incoming
    gradients, which is the add again."""

    @staticmethod
    def forward(ctx, grad_output):
        return add_backward(grad_output)

    @staticmethod
    def backward(ctx, grad_grad_a, grad_grad_b):
        return AddFunction.apply(grad_grad_a, grad_grad_b)


class AddModule(torch.nn.Module):
    """The torch.utils.ffi example's MyAddModule: forward(input1, input2) = input1 + input2."""

    def forward(self, input1: torch.Tensor, input2: torch.Tensor) -> torch.Tensor:
        return AddFunction.apply(input1, input2)


class LinearFunction(torch.autograd.Function):
    """y = x W^T + b in C. Call it as LinearFunction.apply(input, weight, bias=None)."""

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        output = linear(input, weight, bias)  # checks first, then C
        needs_input, needs_weight = ctx.needs_input_grad[:2]
        # Save only what the requested gradients need: grad_input needs W, grad_weight needs x.
        ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)
        ctx.input_shape = input.shape
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        needs_input, needs_weight, needs_bias = (*ctx.needs_input_grad, False)[:3]
        grad_input = grad_weight = grad_bias = None
        grad_output_2d = as_rows(grad_output)  # (N, out)
        # The C library has a forward only; both matrix products are that forward again.
        if needs_input:  # (N, out) @ (out, in) = linear(grad_out, W^T)
            grad_input = LinearFunction.apply(grad_output_2d, weight.t()).reshape(ctx.input_shape)
        if needs_weight:  # (out, N) @ (N, in) = linear(grad_out^T, x^T)
            input_2d = as_rows(input)
            grad_weight = LinearFunction.apply(grad_output_2d.t(), input_2d.t())
        if needs_bias:
            grad_bias = grad_output_2d.sum(dim=0)
        return grad_input, grad_weight, grad_bias


class Layer(torch.nn.Module):
    """y = x W^T + b for an input of shape (*, in_features), computed in C: a drop-in for torch.nn.Linear."""

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
        return LinearFunction.apply(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
