"""bfloat16 and autocast checks shared by every stage that computes in bfloat16.

bfloat16 keeps 8 bits of significand: one rounding costs up to 2^-8 of the value, so a bf16
layer cannot match a float64 reference to float32's tolerance. What it can be held to is the
error of ``torch.nn.Linear`` itself in bfloat16 on the same inputs: against a float64 reference
(computed from the very same bf16 values, so only the arithmetic differs), a stage's error on
the output and on each gradient may not exceed about twice torch's, plus half a bf16 rounding
of the largest reference value (so that a lucky exact torch result does not demand perfection).

    from eml.common.bf16_checks import Bf16LayerTests
    class TestBf16(Bf16LayerTests):
        make_layer = staticmethod(Layer)     # Layer(in_features, out_features, bias=True)

The same functions serve the tour and the notebooks: ``bf16_errors`` gives the errors of one
layer and of torch on one shape, ``check_bf16_errors`` asserts the rule.

Autocast, checked against what ``torch.nn.Linear`` does (not against a fixed list): under
``torch.autocast("cpu", dtype=torch.bfloat16)`` a float32 layer's output has nn.Linear's dtype
(bfloat16) and values, its float32 parameters and input get float32 gradients; outside
autocast a bfloat16 input to a float32 layer is refused as nn.Linear refuses it (a RuntimeError
that names both dtypes).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from eml.common.checks import CASES, Case, reference_linear

NAMES = ["output", "grad_input", "grad_weight", "grad_bias"]

# How far a stage's bf16 error may go beyond torch.nn.Linear's own bf16 error on the same inputs.
FACTOR = 2.0
# Plus this share of the largest |reference| value: half the largest bf16 rounding (2^-9).
FLOOR = 2.0**-9

# The shared awkward shapes (common.checks.CASES: 1, 0-size batch, primes, 1-D input, extra
# leading dimensions) and two longer reductions, where a bf16 accumulator would show.
BF16_CASES = CASES + [Case((131,), 257, 67), Case((2, 40), 300, 7)]


def _bf16_inputs(case, seed):
    generator = torch.Generator().manual_seed(seed)
    input = torch.randn(*case.leading, case.in_features, generator=generator).bfloat16()
    grad_output = torch.randn(*case.leading, case.out_features, generator=generator).bfloat16()
    return input, grad_output


def _run(layer, input, grad_output):
    """output and the gradients of input, weight (and bias) of one layer, as float64."""
    input = input.detach().requires_grad_()
    output = layer(input)
    params = [layer.weight] + ([layer.bias] if layer.bias is not None else [])
    grads = torch.autograd.grad(output, [input] + params, grad_output)
    return [t.detach() for t in (output, *grads)]


def bf16_errors(make_layer, case: Case, bias=True, seed=0):
    """Max |error| against a float64 reference of a stage's bf16 layer and of torch.nn.Linear in
    bf16, on the same bf16 weights, input and grad_output. Returns {name: (stage, torch, scale)},
    scale = max |reference|, and checks dtypes and shapes on the way."""
    torch.manual_seed(seed)
    reference = torch.nn.Linear(case.in_features, case.out_features, bias=bias).to(torch.bfloat16)
    layer = make_layer(case.in_features, case.out_features, bias=bias).to(torch.bfloat16)
    layer.load_state_dict(reference.state_dict())
    input, grad_output = _bf16_inputs(case, seed)
    b64 = reference.bias.double() if bias else None
    exact_output, exact_grads = reference_linear(input.double(), reference.weight.double(), b64, grad_output.double())
    exact = [exact_output, *exact_grads]
    got, torch_got = _run(layer, input, grad_output), _run(reference, input, grad_output)
    errors = {}
    for name, g, t, e in zip(NAMES, got, torch_got, exact):
        assert g.dtype == t.dtype == torch.bfloat16, f"{name} {case}: dtype {g.dtype}, nn.Linear gives {t.dtype}"
        assert g.shape == e.shape, f"{name} {case}: shape {tuple(g.shape)}, expected {tuple(e.shape)}"

        def error(a):
            return (a.double() - e).abs().max().item() if e.numel() else 0.0

        errors[name] = (error(g), error(t), e.abs().max().item() if e.numel() else 0.0)
    return errors


def check_bf16_errors(make_layer, case: Case, bias=True, seed=0, factor=FACTOR):
    """Assert the rule on output and every gradient: stage error <= factor * torch's + FLOOR * scale."""
    errors = bf16_errors(make_layer, case, bias, seed)
    for name, (stage, torch_error, scale) in errors.items():
        allowed = factor * torch_error + FLOOR * scale
        assert not math.isnan(stage) and stage <= allowed, (
            f"{name} {case} bias={bias}: bf16 error {stage:.3g} against float64, torch.nn.Linear's own bf16 error "
            f"{torch_error:.3g}: more than {factor} x that + {FLOOR:.3g} x max|ref| ({allowed:.3g})")
    return errors


# -- autocast and mixed dtypes, against what torch.nn.Linear does --------------------------
def check_autocast_like_nn_linear(make_layer, case: Case = Case((3, 5), 33, 65), bias=True, seed=0):
    """float32 layer under torch.autocast("cpu", dtype=torch.bfloat16): output dtype and values as
    nn.Linear's, float32 gradients for the float32 parameters and input; outside autocast again
    float32; the bf16 output fed to a second layer under autocast works as with nn.Linear."""
    torch.manual_seed(seed)
    reference = torch.nn.Linear(case.in_features, case.out_features, bias=bias)
    layer = make_layer(case.in_features, case.out_features, bias=bias)
    layer.load_state_dict(reference.state_dict())
    generator = torch.Generator().manual_seed(seed)
    input = torch.randn(*case.leading, case.in_features, generator=generator)
    results = []
    for module in (layer, reference):
        x = input.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = module(x)
        grad_output = torch.ones_like(output)
        output.backward(grad_output)
        grads = [x.grad] + [p.grad for p in (module.weight, module.bias) if p is not None]
        results.append((output.detach(), grads))
        module.zero_grad(set_to_none=True)
    (got, got_grads), (want, want_grads) = results
    assert got.dtype == want.dtype, f"under autocast: output dtype {got.dtype}, nn.Linear gives {want.dtype}"
    assert got.shape == want.shape, f"under autocast: output shape {tuple(got.shape)}, nn.Linear gives {tuple(want.shape)}"
    for name, g, w in zip(["input", "weight", "bias"], got_grads, want_grads):
        assert g is not None, f"under autocast: no gradient for the {name} (nn.Linear gives one, {w.dtype})"
        assert g.dtype == w.dtype == torch.float32, f"under autocast: grad_{name} dtype {g.dtype}, nn.Linear gives {w.dtype}"
    # The values: both computed from the same bf16 casts, so the bf16 rule applies.
    exact = reference_linear(input.bfloat16().double(), reference.weight.bfloat16().double(),
                             reference.bias.bfloat16().double() if bias else None,
                             torch.ones(got.shape, dtype=torch.float64))
    exact = [exact[0], *exact[1]]
    for name, g, w, e in zip(NAMES, [got, *got_grads], [want, *want_grads], exact):
        stage, ref = (g.double() - e).abs().max().item(), (w.double() - e).abs().max().item()
        allowed = FACTOR * ref + FLOOR * e.abs().max().item()
        assert stage <= allowed, f"under autocast: {name} error {stage:.3g}, nn.Linear's {ref:.3g} (allowed {allowed:.3g})"
    # Outside autocast the layer is float32 again; a second layer under autocast takes the bf16 output.
    x = input.clone()
    assert layer(x).dtype == reference(x).dtype == torch.float32, "after autocast: float32 again"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        second = make_layer(case.out_features, 3)
        assert second(layer(x)).dtype == torch.bfloat16, "a chain of layers under autocast"


def check_bf16_input_to_float32_layer_like_nn_linear(make_layer):
    """Outside autocast, a bfloat16 input to a float32 layer: nn.Linear raises a RuntimeError
    ("mat1 and mat2 must have the same dtype"); the stage must raise the same type of exception,
    naming both dtypes, not cast silently."""
    reference, layer = torch.nn.Linear(8, 3), make_layer(8, 3)
    x = torch.randn(4, 8).bfloat16()
    with pytest.raises(RuntimeError, match="dtype") as want:
        reference(x)
    try:
        layer(x)
    except Exception as error:  # any type here, so that a wrong one is named below
        got = error
    else:
        pytest.fail("a bfloat16 input to a float32 layer ran (cast silently); nn.Linear raises")
    assert isinstance(got, want.type), f"nn.Linear raises {want.type.__name__}, the layer raises {type(got).__name__}: {got}"
    message = str(got)
    for pattern in ("BFloat16|bfloat16", "Float\\b|float32"):
        assert re.search(pattern, message), f"the error does not name {pattern}: {message}"


# -- the test contract: inherit it in a class named Test* ----------------------------------
class Bf16LayerTests:
    """Every bfloat16 and autocast check; set ``make_layer`` as for common.checks.LayerTests."""

    make_layer = None

    @pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
    @pytest.mark.parametrize("case", BF16_CASES, ids=str)
    def test_bf16_error_at_most_twice_nn_linear(self, case, bias):
        check_bf16_errors(self.make_layer, case, bias)

    @pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
    def test_autocast_like_nn_linear(self, bias):
        check_autocast_like_nn_linear(self.make_layer, bias=bias)

    def test_bf16_input_to_float32_layer_like_nn_linear(self):
        check_bf16_input_to_float32_layer_like_nn_linear(self.make_layer)

    def test_bf16_parameters_and_input(self):
        """A layer made in bfloat16 (dtype=, or .to()) takes bf16 input and gives bf16 results."""
        layer = self.make_layer(6, 4, dtype=torch.bfloat16)
        assert layer.weight.dtype == torch.bfloat16
        x = torch.randn(3, 6).bfloat16().requires_grad_()
        y = layer(x)
        y.sum().backward()
        assert y.dtype == x.grad.dtype == layer.weight.grad.dtype == layer.bias.grad.dtype == torch.bfloat16
