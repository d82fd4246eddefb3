"""The shared bfloat16 and autocast checks (eml.common.bf16_checks) are only worth something if
they fail on wrong layers: each broken layer below must be caught by the check named beside it,
and torch.nn.Linear itself must pass them all."""

import pytest
import torch
import torch.nn.functional as F

from eml.common import bf16_checks
from eml.common.checks import Case


class AccumulatesInBf16(torch.nn.Linear):
    """Sums the products in a bf16 accumulator, rounding after every term (no fp32 accumulation)."""

    def forward(self, input):
        if input.dtype != torch.bfloat16:
            return super().forward(input)
        acc = torch.zeros(*input.shape[:-1], self.out_features, dtype=torch.bfloat16)
        for k in range(self.in_features):
            acc = acc + input[..., k : k + 1] * self.weight[:, k]  # each bf16 add rounds
        return acc if self.bias is None else acc + self.bias


class _Bf16BiasSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight)
        return F.linear(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        rows = grad_output.reshape(-1, grad_output.shape[-1])
        grad_bias = torch.zeros(rows.shape[1], dtype=rows.dtype)
        for row in rows:  # a bf16 running sum: rounds after every row
            grad_bias = grad_bias + row
        grad_input = grad_output @ weight
        grad_weight = rows.t() @ input.reshape(-1, input.shape[-1])
        return grad_input, grad_weight, grad_bias


class GradBiasInBf16(torch.nn.Linear):
    """Right output, but grad_bias summed in bf16 instead of fp32."""

    def forward(self, input):
        if self.bias is None:
            return super().forward(input)
        return _Bf16BiasSum.apply(input, self.weight, self.bias)


class IgnoresAutocast(torch.nn.Linear):
    """Computes in float32 under autocast: the output is float32 where nn.Linear's is bf16."""

    def forward(self, input):
        with torch.autocast("cpu", enabled=False):
            return F.linear(input, self.weight, self.bias)


class DetachesMasterWeights(torch.nn.Linear):
    """Under autocast casts the weight with .detach(): the float32 weight gets no gradient."""

    def forward(self, input):
        if torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                bias = None if self.bias is None else self.bias.bfloat16()
                return F.linear(input.bfloat16(), self.weight.detach().bfloat16(), bias)
        return super().forward(input)


class CastsInputSilently(torch.nn.Linear):
    """Casts any input to the weight's dtype, where nn.Linear refuses a bf16 input to a float32 layer."""

    def forward(self, input):
        return super().forward(input.to(self.weight.dtype))


def test_nn_linear_passes_every_check():
    for case in [Case((3,), 17, 31), Case((131,), 257, 67), Case((0,), 5, 3), Case((), 19, 23)]:
        bf16_checks.check_bf16_errors(torch.nn.Linear, case, bias=True)
        bf16_checks.check_bf16_errors(torch.nn.Linear, case, bias=False)
    bf16_checks.check_autocast_like_nn_linear(torch.nn.Linear)
    bf16_checks.check_bf16_input_to_float32_layer_like_nn_linear(torch.nn.Linear)


@pytest.mark.parametrize(
    "layer_class, check, args, message",
    [
        (AccumulatesInBf16, bf16_checks.check_bf16_errors, (Case((65,), 129, 95),), r"^output .*bf16 error"),
        (GradBiasInBf16, bf16_checks.check_bf16_errors, (Case((131,), 257, 67),), r"^grad_bias .*bf16 error"),
        (IgnoresAutocast, bf16_checks.check_autocast_like_nn_linear, (), r"under autocast: output dtype"),
        (DetachesMasterWeights, bf16_checks.check_autocast_like_nn_linear, (), r"under autocast: no gradient for the weight"),
        (CastsInputSilently, bf16_checks.check_bf16_input_to_float32_layer_like_nn_linear, (), r"cast silently"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_broken_layer_is_caught(layer_class, check, args, message):
    """Caught by the check named beside it, for the reason named beside it."""
    with pytest.raises((AssertionError, pytest.fail.Exception), match=message):
        check(layer_class, *args)
