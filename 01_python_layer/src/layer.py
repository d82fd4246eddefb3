"""Stage 01: a linear layer written as a plain ``torch.nn.Module``.

What this stage teaches: a module owns its parameters (``weight``, ``bias``), initialises them
exactly like ``torch.nn.Linear``, and computes ``y = x W^T + b`` in ``forward`` with tensor
operations; autograd records those operations and derives the backward pass by itself.
What changed: nothing yet, this is the starting point. Stage 02 moves the forward into a
``torch.autograd.Function`` and writes the backward by hand.
Run it: ``pip install --no-build-isolation .`` here, then
``python -c "from eml.ext.linear_python import Layer; print(Layer(4, 2))"``.
"""

import math

import torch

# The stage's name, the first word of every error message: the one line that names the stage.
STAGE = "linear_python"


def check_input(input: torch.Tensor, weight: torch.Tensor) -> None:
    """The stage's one place for input validation: say what is wrong, and with which value."""
    if input.dim() == 0:
        raise ValueError(f"{STAGE}: expected an input with at least 1 dimension (*, in_features), got a 0-d tensor")
    if input.device != weight.device:
        raise ValueError(f"{STAGE}: expected the input on the layer's device {weight.device}, got device {input.device}")
    if not input.is_floating_point():
        raise TypeError(f"{STAGE}: expected a floating-point input dtype, got {input.dtype}")
    if input.dtype != weight.dtype:
        raise TypeError(f"{STAGE}: expected input dtype {weight.dtype} (the layer's dtype), got {input.dtype}")
    if input.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{STAGE}: expected {weight.shape[1]} input features in the last dimension, "
            f"got {input.shape[-1]} (input shape {list(input.shape)})"
        )


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
        check_input(input, self.weight)
        # (*, in) @ (in, out) -> (*, out); matmul broadcasts over the leading dimensions
        output = torch.matmul(input, self.weight.t())
        if self.bias is not None:
            output = output + self.bias  # broadcast over every leading dimension
        return output

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
