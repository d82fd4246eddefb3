"""The shared checks are only worth something if they fail on wrong layers: each broken
layer below must be caught by the check named beside it."""


import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from eml.common import checks
from eml.common.checks import LayerTests


class Linear(torch.nn.Linear):
    """nn.Linear with input checks; the broken layers below derive from it."""

    def forward(self, input):
        if input.dim() == 0 or input.shape[-1] != self.in_features or input.dtype != self.weight.dtype:
            raise ValueError(f"bad input: {input.dtype} {list(input.shape)} 0-d features {self.in_features}")
        return super().forward(input)


class ForgetsBias(Linear):
    def forward(self, input):
        return torch.nn.functional.linear(input, self.weight)


class DetachesBias(Linear):
    def forward(self, input):
        return torch.nn.functional.linear(input, self.weight, self.bias.detach())


class WrongGradInput(Linear):
    def forward(self, input):
        # right value, wrong gradient for the input: detach then re-add a scaled copy
        output = torch.nn.functional.linear(input, self.weight, self.bias)
        return output + 0.5 * (torch.nn.functional.linear(input, self.weight) - torch.nn.functional.linear(input.detach(), self.weight))


class RoundsToHalf(Linear):
    def forward(self, input):
        return torch.nn.functional.linear(input.half().to(input.dtype), self.weight, self.bias)


class NoChecks(torch.nn.Linear):
    """Crashes on bad input with torch's own messages, which do not name the feature count."""

    def forward(self, input):
        return input.matmul(self.weight.t().contiguous()).add(self.bias)


class Harness(LayerTests):
    pass


def run(layer_class, test, *args):
    harness = Harness()
    harness.make_layer = layer_class
    getattr(harness, test)(*args)


def test_correct_layer_passes():
    run(Linear, "test_matches_reference", checks.CASES[7], torch.float64, True)
    run(Linear, "test_requires_grad_on_some_inputs", ("input", "bias"))
    run(Linear, "test_rejects_wrong_feature_count")


@pytest.mark.parametrize(
    "layer_class, test, args, error, message",
    [
        # Caught by its output, compared before any gradient is asked for.
        (ForgetsBias, "test_matches_reference", (checks.CASES[7], torch.float32, True), AssertionError,
         r"output: Tensor-likes are not close"),
        # A bias that is added but cut off from autograd: the output is right, its gradient None.
        (DetachesBias, "test_matches_reference", (checks.CASES[7], torch.float64, True), AssertionError,
         r"grad_bias: the output does not depend on the bias"),
        (WrongGradInput, "test_matches_reference", (checks.CASES[7], torch.float64, True), AssertionError,
         r"grad_input: Tensor-likes are not close"),
        (WrongGradInput, "test_gradcheck", ((3,), True), GradcheckError, r"Jacobian mismatch"),
        (RoundsToHalf, "test_matches_reference", (checks.CASES[6], torch.float64, True), AssertionError,
         r"output: Tensor-likes are not close"),
        # The float32 tolerance is tight enough to see one float16 rounding of the input.
        (RoundsToHalf, "test_matches_reference", (checks.CASES[6], torch.float32, True), AssertionError,
         r"output: Tensor-likes are not close"),
        (NoChecks, "test_rejects_wrong_feature_count", (), AssertionError, r"the error message does not say 'feature"),
    ],
    ids=["ForgetsBias", "DetachesBias", "WrongGradInput-reference", "WrongGradInput-gradcheck", "RoundsToHalf-float64",
         "RoundsToHalf-float32", "NoChecks"],
)
def test_broken_layer_is_caught(layer_class, test, args, error, message):
    with pytest.raises(error, match=message):
        run(layer_class, test, *args)

