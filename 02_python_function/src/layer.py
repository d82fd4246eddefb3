"""Stage 02: the forward pass moved into a ``torch.autograd.Function``, the backward by hand.

What this stage teaches: the contract every custom operator meets, in Python first.
``Function.forward`` computes ``y = x W^T + b`` and saves what the backward needs;
``Function.backward`` receives dL/dy and returns dL/dx, dL/dW, dL/db:

    grad_input  = grad_output @ W                (*, out) @ (out, in)  -> (*, in)
    grad_weight = grad_output^T @ x              (out, N) @ (N, in)    -> (out, in)
    grad_bias   = sum of grad_output over N                            -> (out,)

where N is the product of all leading dimensions. It computes only what
``ctx.needs_input_grad`` asks for and saves only the tensors those gradients need.
What changed since stage 01: ``Layer.forward`` now calls ``Function.apply``; validation also
covers the weight and bias, because the Function can be called without a Layer.
Run it: ``pip install --no-build-isolation .`` here, then ``pytest tests``.
"""

import math

import torch

# The stage's name, the first word of every error message: the one line that names the stage.
STAGE = "linear_python_function"


def check_inputs(input: torch.Tensor, weight: torch.Tensor, bias) -> None:
    """The stage's one place for input validation: say what is wrong, and with which value."""
    if input.dim() == 0:
        raise ValueError(f"{STAGE}: expected an input with at least 1 dimension (*, in_features), got a 0-d tensor")
    if weight.dim() != 2:
        raise ValueError(f"{STAGE}: expected a 2-d weight (out_features, in_features), got {weight.dim()} dimension(s): {list(weight.shape)}")
    if input.device != weight.device:
        raise ValueError(f"{STAGE}: expected the input on the weight's device {weight.device}, got device {input.device}")
    if not input.is_floating_point():
        raise TypeError(f"{STAGE}: expected a floating-point input dtype, got {input.dtype}")
    if input.dtype != weight.dtype:
        raise TypeError(f"{STAGE}: expected input dtype {weight.dtype} (the weight's dtype), got {input.dtype}")
    if input.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{STAGE}: expected {weight.shape[1]} input features in the last dimension, "
            f"got {input.shape[-1]} (input shape {list(input.shape)})"
        )
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != weight.dtype or bias.device != weight.device):
        raise ValueError(
            f"{STAGE}: expected a bias of shape [{weight.shape[0]}] (out_features), {weight.dtype}, "
            f"on {weight.device}; got shape {list(bias.shape)}, {bias.dtype}, on {bias.device}"
        )


class Function(torch.autograd.Function):
    """y = x W^T + b with a hand-written backward. Call it as Function.apply(input, weight, bias)."""

    @staticmethod
    def forward(ctx, input, weight, bias=None):
        check_inputs(input, weight, bias)
        needs_input, needs_weight = ctx.needs_input_grad[:2]
        # Save only what the requested gradients need: grad_input needs W, grad_weight needs x.
        ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)
        ctx.input_shape = input.shape
        output = torch.matmul(input, weight.t())
        if bias is not None:
            output = output + bias
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        # needs_input_grad has one flag per forward argument: 2 when apply(input, weight).
        needs_input, needs_weight, needs_bias = (*ctx.needs_input_grad, False)[:3]
        grad_input = grad_weight = grad_bias = None
        # Treat every leading dimension as batch: (*, out) -> (N, out).
        grad_output_2d = grad_output.reshape(-1, grad_output.shape[-1])
        if needs_input:
            grad_input = torch.matmul(grad_output_2d, weight).reshape(ctx.input_shape)
        if needs_weight:
            grad_weight = torch.matmul(grad_output_2d.t(), input.reshape(-1, input.shape[-1]))
        if needs_bias:
            grad_bias = grad_output_2d.sum(dim=0)
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
