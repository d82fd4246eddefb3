"""Reference checks shared by every stage's tests.

A stage's test file does not copy these tests; it inherits them:

    from eml.common.checks import LayerTests, FunctionTests
    from eml.ext.linear_python import Layer

    class TestLayer(LayerTests):
        make_layer = staticmethod(Layer)            # Layer(in_features, out_features, bias=...)

pytest collects every ``test_*`` method below for each stage. The reference is always
``torch.nn.functional.linear`` with autograd on the same weights; the shape set holds the
awkward cases (batch 1, a 0-size batch, primes, sizes that are not multiples of 16/32/64,
extra leading dimensions, 1-D input), with and without bias, in float32 and float64.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F


# ---------------------------------------------------------------------------------------
# The shared shape set
# ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    """One input shape: ``input`` is ``(*leading, in_features)``; ``leading == ()`` is 1-D."""

    leading: tuple
    in_features: int
    out_features: int

    def __str__(self):
        lead = "x".join(str(n) for n in self.leading) or "1d"
        return f"{lead}-{self.in_features}-{self.out_features}"


CASES = [
    Case((1,), 1, 1),          # the smallest layer there is
    Case((1,), 7, 13),         # batch 1, primes
    Case((0,), 5, 3),          # 0-size batch: empty output, zero weight gradient
    Case((2, 0, 3), 4, 6),     # 0-size leading dimension in the middle
    Case((), 19, 23),          # 1-D input: no batch dimension at all
    Case((3,), 17, 31),        # primes everywhere
    Case((37,), 61, 53),       # primes bigger than a SIMD register of floats
    Case((2, 5), 33, 65),      # leading dimensions; 33 and 65 are one past 32 and 64
    Case((65,), 129, 95),      # one past a block of 64 / 128, and not a multiple of 16
    Case((64,), 64, 64),       # exact multiples: the easy case must work too
    Case((3, 2, 7), 100, 10),  # three leading dimensions
]

DTYPES = [torch.float32, torch.float64]

# float32 sums of up to ~130 products: compare with a relative tolerance around 1e-5;
# float64 must agree to near machine precision.
TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float64: dict(rtol=1e-12, atol=1e-12),
}

# Which of (input, weight, bias) require a gradient. A layer's user meets all of these:
# a frozen layer, a first layer whose input needs no gradient, a bias-only fine-tune...
REQUIRES_GRAD_SUBSETS = [
    ("input",),
    ("weight",),
    ("bias",),
    ("input", "bias"),
    ("weight", "bias"),
    ("input", "weight", "bias"),
    (),
]


def make_input(case: Case, dtype=torch.float32, seed=0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*case.leading, case.in_features, generator=generator, dtype=dtype)


def reference_linear(input, weight, bias, grad_output):
    """Output and gradients of torch.nn.functional.linear by autograd, on detached copies."""
    input, weight = input.detach().requires_grad_(), weight.detach().requires_grad_()
    leaves = [input, weight]
    if bias is not None:
        bias = bias.detach().requires_grad_()
        leaves.append(bias)
    output = F.linear(input, weight, bias)
    grads = torch.autograd.grad(output, leaves, grad_output)
    return output.detach(), grads


def assert_close(actual, expected, dtype, what):
    torch.testing.assert_close(actual, expected, **TOLERANCES[dtype], msg=lambda m: f"{what}: {m}")


# ---------------------------------------------------------------------------------------
# Checks that any stage's code can call directly (the tour and notebooks use them too)
# ---------------------------------------------------------------------------------------
def max_errors(layer: torch.nn.Module, input: torch.Tensor, seed=1) -> dict:
    """Max absolute error of output and of each gradient against F.linear + autograd."""
    generator = torch.Generator().manual_seed(seed)
    input = input.detach().requires_grad_()
    output = layer(input)
    grad_output = torch.randn(output.shape, generator=generator, dtype=output.dtype)
    params = [layer.weight] + ([layer.bias] if layer.bias is not None else [])
    grads = torch.autograd.grad(output, [input] + params, grad_output)
    ref_output, ref_grads = reference_linear(input, layer.weight, layer.bias, grad_output)
    names = ["output", "grad_input", "grad_weight", "grad_bias"]
    actual = [output.detach(), *grads]
    expected = [ref_output, *ref_grads]
    return {
        name: (a - e).abs().max().item() if a.numel() else 0.0
        for name, a, e in zip(names, actual, expected)
    }


def gradcheck(fn, *inputs, **kwargs) -> bool:
    """torch.autograd.gradcheck in float64; raises with the offending Jacobian on failure."""
    return torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, **kwargs)


def gradgradcheck(fn, *inputs, **kwargs) -> bool:
    """Second derivatives (double backward) in float64; raises on failure."""
    return torch.autograd.gradgradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, **kwargs)


def gradcheck_inputs(seed=0, leading=(3,), in_features=5, out_features=4, bias=True):
    """Small float64 leaves for gradcheck: input, weight and (optionally) bias."""
    generator = torch.Generator().manual_seed(seed)

    def leaf(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    return (
        leaf(*leading, in_features),
        leaf(out_features, in_features),
        leaf(out_features) if bias else None,
    )


def expect_error(fn, *patterns):
    """Call fn; it must raise a Python exception whose message matches every pattern.

    Each pattern is a regular expression, so one check can accept both spellings of a
    dtype: Python's ``torch.int64`` and C++'s ``Long``.
    """
    with pytest.raises((RuntimeError, ValueError, TypeError)) as info:
        fn()
    message = str(info.value)
    for pattern in patterns:
        assert re.search(pattern, message, flags=re.IGNORECASE), (
            f"the error message does not say {pattern!r}:\n{message}"
        )
    return message


# A dtype named the Python way or the C++ way.
DTYPE_NAMES = {
    torch.float32: r"(float32|Float\b|float\b)",
    torch.float64: r"(float64|Double|double)",
    torch.int64: r"(int64|Long|long)",
}


# ---------------------------------------------------------------------------------------
# The test contracts: inherit them in a class named Test*
# ---------------------------------------------------------------------------------------
class LayerTests:
    """Every check a drop-in for ``torch.nn.Linear`` must pass.

    Set ``make_layer`` to a callable ``(in_features, out_features, bias=True) -> Module``.
    Set ``double_backward`` to True when the layer supports gradients of gradients; when it
    is False, double backward must fail with a clear error instead of a wrong answer.
    """

    make_layer = None
    double_backward = True

    def layer(self, case: Case, dtype=torch.float32, bias=True, seed=0):
        torch.manual_seed(seed)
        return self.make_layer(case.in_features, case.out_features, bias=bias).to(dtype)

    # -- the module itself --------------------------------------------------------------
    @pytest.mark.parametrize("bias", [True, False])
    def test_parameters_like_nn_linear(self, bias):
        layer = self.make_layer(37, 11, bias=bias)
        reference = torch.nn.Linear(37, 11, bias=bias)
        assert isinstance(layer, torch.nn.Module)
        assert layer.weight.shape == reference.weight.shape
        assert layer.weight.dtype == reference.weight.dtype
        assert isinstance(layer.weight, torch.nn.Parameter)
        # kaiming_uniform_(a=sqrt(5)) on the weight: U(-1/sqrt(in), 1/sqrt(in)), as nn.Linear
        bound = 1 / math.sqrt(37)
        assert layer.weight.abs().max() <= bound
        assert layer.weight.std() > bound / 4, "the weight looks uninitialised"
        if bias:
            assert isinstance(layer.bias, torch.nn.Parameter)
            assert layer.bias.shape == (11,)
            assert layer.bias.abs().max() <= bound
            assert layer.bias.abs().max() > 0
        else:
            assert layer.bias is None
        names = sorted(name for name, _ in layer.named_parameters())
        assert names == sorted(name for name, _ in reference.named_parameters())

    def test_accepts_what_nn_linear_accepts(self):
        """Keywords as nn.Linear takes them (in_features, out_features, bias, device, dtype),
        and the course's names for the sizes (i_n_features_input, i_n_features_output)."""
        layer = self.make_layer(in_features=4, out_features=2, bias=False)
        assert (layer.in_features, layer.out_features, layer.bias) == (4, 2, None)
        layer = self.make_layer(i_n_features_input=4, i_n_features_output=2)
        assert layer.weight.shape == (2, 4) and layer.bias.shape == (2,)
        layer = self.make_layer(5, 3, dtype=torch.float64, device="cpu")
        assert layer.weight.dtype == layer.bias.dtype == torch.float64
        x = torch.randn(2, 5, dtype=torch.float64)
        assert_close(layer(x), F.linear(x, layer.weight, layer.bias), torch.float64, "output of a dtype=float64 layer")
        layer = self.make_layer(5, 3, device="meta")  # as nn.Linear: parameters without memory
        assert layer.weight.device.type == layer.bias.device.type == "meta"

    def test_extra_repr_names_the_sizes(self):
        text = repr(self.make_layer(37, 11, bias=False))
        for fragment in ("37", "11", "bias=False"):
            assert fragment in text, f"{fragment!r} missing from {text!r}"

    def test_loads_nn_linear_state_dict(self):
        reference = torch.nn.Linear(29, 7)
        layer = self.make_layer(29, 7)
        layer.load_state_dict(reference.state_dict())
        x = make_input(Case((5,), 29, 7))
        assert_close(layer(x), reference(x), torch.float32, "output after load_state_dict")

    # -- output and gradients against the reference -------------------------------------
    @pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("case", CASES, ids=str)
    def test_matches_reference(self, case, dtype, bias):
        layer = self.layer(case, dtype, bias)
        input = make_input(case, dtype).requires_grad_()
        output = layer(input)
        assert output.shape == (*case.leading, case.out_features)
        assert output.dtype == dtype
        grad_output = torch.randn_like(output)
        ref_output, ref_grads = reference_linear(input, layer.weight, layer.bias, grad_output)
        assert_close(output, ref_output, dtype, "output")  # first: a wrong output explains wrong gradients
        params = [layer.weight] + ([layer.bias] if bias else [])
        grads = torch.autograd.grad(output, [input] + params, grad_output, allow_unused=True)
        for name, grad, ref in zip(["input", "weight", "bias"], grads, ref_grads):
            assert grad is not None, f"grad_{name}: the output does not depend on the {name} (None from autograd)"
            assert grad.shape == ref.shape, f"grad_{name} shape"
            assert_close(grad, ref, dtype, f"grad_{name}")

    @pytest.mark.parametrize("requires_grad", REQUIRES_GRAD_SUBSETS, ids=lambda s: "+".join(s) or "none")
    def test_requires_grad_on_some_inputs(self, requires_grad):
        case = Case((6,), 9, 5)
        layer = self.layer(case, torch.float64)
        input = make_input(case, torch.float64).requires_grad_("input" in requires_grad)
        layer.weight.requires_grad_("weight" in requires_grad)
        layer.bias.requires_grad_("bias" in requires_grad)
        output = layer(input)
        assert output.requires_grad == bool(requires_grad)
        ref_output, ref_grads = reference_linear(input, layer.weight, layer.bias, torch.ones_like(output))
        assert_close(output.detach(), ref_output, torch.float64, "output")
        if not requires_grad:
            return
        output.backward(torch.ones_like(output))
        # Autograd hands a leaf that does not require grad no gradient, whatever the backward
        # computes: whether the backward skips that work is tested on the backward itself
        # (CppModuleTests for the C++ stages, each Python stage's own test), not here.
        for name, tensor, ref in zip(["input", "weight", "bias"], [input, layer.weight, layer.bias], ref_grads):
            if name in requires_grad:
                assert tensor.grad is not None, f"grad_{name} was asked for and not computed"
                assert_close(tensor.grad, ref, torch.float64, f"grad_{name}")

    def test_non_contiguous_input(self):
        case = Case((7,), 12, 10)
        layer = self.layer(case, torch.float64)
        wide = torch.randn(12, 7, dtype=torch.float64)
        input = wide.t().requires_grad_()  # a transposed view: stride (1, 7)
        assert not input.is_contiguous()
        output = layer(input)
        output.sum().backward()
        ref_output, ref_grads = reference_linear(input, layer.weight, layer.bias, torch.ones_like(output))
        assert_close(output, ref_output, torch.float64, "output")
        assert_close(input.grad, ref_grads[0], torch.float64, "grad_input")
        assert_close(layer.weight.grad, ref_grads[1], torch.float64, "grad_weight")

    def test_parameter_changes_are_honoured(self):
        """An optimizer step, an in-place edit and load_state_dict all show in the next call."""
        case = Case((4,), 20, 9)
        layer = self.layer(case, torch.float32)
        input = make_input(case)
        layer(input).sum().backward()
        torch.optim.SGD(layer.parameters(), lr=0.5).step()
        assert_close(layer(input), F.linear(input, layer.weight, layer.bias), torch.float32, "after SGD step")
        with torch.no_grad():
            layer.weight.mul_(-2.0)
            layer.bias.add_(1.0)
        assert_close(layer(input), F.linear(input, layer.weight, layer.bias), torch.float32, "after in-place edit")
        other = torch.nn.Linear(20, 9)
        layer.load_state_dict(other.state_dict())
        assert_close(layer(input), other(input), torch.float32, "after load_state_dict")

    # -- gradcheck ------------------------------------------------------------------------
    @pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
    @pytest.mark.parametrize("leading", [(3,), (2, 3), ()], ids=["2d", "3d", "1d"])
    def test_gradcheck(self, leading, bias):
        layer = self.layer(Case(leading, 5, 4), torch.float64, bias)
        input = make_input(Case(leading, 5, 4), torch.float64).requires_grad_()
        params = [layer.weight] + ([layer.bias] if bias else [])

        def run(input, weight, *bias):
            return torch.func.functional_call(layer, dict(zip(["weight", "bias"], [weight, *bias])), (input,))

        assert gradcheck(run, input, *params)

    def test_double_backward(self):
        layer = self.layer(Case((3,), 5, 4), torch.float64)
        input = make_input(Case((3,), 5, 4), torch.float64).requires_grad_()

        def run(input, weight, bias):
            return torch.func.functional_call(layer, {"weight": weight, "bias": bias}, (input,))

        if self.double_backward:
            assert gradgradcheck(run, input, layer.weight, layer.bias)
        else:
            # A backward that is not itself differentiable must refuse, not answer wrongly.
            output = run(input, layer.weight, layer.bias)
            (grad_input,) = torch.autograd.grad(output.sum(), input, create_graph=True)
            expect_error(lambda: grad_input.sum().backward(), r"(once_differentiable|differentiate twice)")

    # -- bad input: a clear Python exception naming the problem and the value ------------
    def test_rejects_wrong_feature_count(self):
        layer = self.make_layer(8, 3)
        expect_error(lambda: layer(torch.randn(4, 7)), r"feature", r"\b7\b", r"\b8\b")

    def test_rejects_integer_input(self):
        layer = self.make_layer(8, 3)
        expect_error(lambda: layer(torch.ones(4, 8, dtype=torch.int64)), r"dtype", DTYPE_NAMES[torch.int64])

    def test_rejects_input_dtype_other_than_the_layers(self):
        layer = self.make_layer(8, 3)  # float32 parameters
        expect_error(
            lambda: layer(torch.randn(4, 8, dtype=torch.float64)),
            r"dtype", DTYPE_NAMES[torch.float64], DTYPE_NAMES[torch.float32],
        )

    def test_rejects_0d_input(self):
        layer = self.make_layer(1, 3)
        expect_error(lambda: layer(torch.tensor(1.0)), r"(0-d|0 dim|zero.dim|scalar)")

    def test_rejects_meta_device(self):
        layer = self.make_layer(8, 3)
        expect_error(lambda: layer(torch.randn(4, 8, device="meta")), r"device", r"meta")


class FunctionTests:
    """Checks of a stage's ``torch.autograd.Function`` called directly.

    Set ``linear`` to a callable ``(input, weight, bias_or_None) -> output`` that goes
    through the stage's Function (e.g. ``staticmethod(Function.apply)``).
    """

    linear = None
    double_backward = True

    @pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
    @pytest.mark.parametrize("leading", [(3,), (2, 3), (1,), ()], ids=["2d", "3d", "batch1", "1d"])
    def test_gradcheck(self, leading, bias):
        input, weight, bias = gradcheck_inputs(leading=leading, bias=bias)
        if bias is None:
            assert gradcheck(lambda x, w: self.linear(x, w, None), input, weight)
        else:
            assert gradcheck(self.linear, input, weight, bias)

    def test_gradgradcheck_or_clear_refusal(self):
        input, weight, bias = gradcheck_inputs()
        if self.double_backward:
            assert gradgradcheck(self.linear, input, weight, bias)
        else:
            output = self.linear(input, weight, bias)
            (grad_weight,) = torch.autograd.grad(output.sum(), weight, create_graph=True)
            expect_error(lambda: grad_weight.sum().backward(), r"(once_differentiable|differentiate twice)")

    @pytest.mark.parametrize("case", [c for c in CASES if c.leading and math.prod(c.leading) < 100], ids=str)
    def test_matches_reference(self, case):
        input = make_input(case, torch.float64).requires_grad_()
        generator = torch.Generator().manual_seed(3)
        weight = torch.randn(case.out_features, case.in_features, generator=generator, dtype=torch.float64, requires_grad=True)
        bias = torch.randn(case.out_features, generator=generator, dtype=torch.float64, requires_grad=True)
        output = self.linear(input, weight, bias)
        grad_output = torch.randn_like(output)
        ref_output, ref_grads = reference_linear(input, weight, bias, grad_output)
        assert_close(output, ref_output, torch.float64, "output")  # first: a wrong output explains wrong gradients
        grads = torch.autograd.grad(output, [input, weight, bias], grad_output, allow_unused=True)
        for name, grad, ref in zip(["input", "weight", "bias"], grads, ref_grads):
            assert grad is not None, f"grad_{name}: the output does not depend on the {name} (None from autograd)"
            assert_close(grad, ref, torch.float64, f"grad_{name}")

    # -- bad input to the Function itself: a mismatched weight or bias -------------------
    def test_rejects_weight_with_other_in_features(self):
        input, weight = torch.randn(4, 6), torch.randn(3, 5)
        expect_error(lambda: self.linear(input, weight, None), r"feature", r"\b6\b", r"\b5\b")

    def test_rejects_1d_weight(self):
        expect_error(lambda: self.linear(torch.randn(4, 6), torch.randn(6), None), r"weight", r"(dim|2-d|2d)", r"\b1\b")

    def test_rejects_bias_of_wrong_size(self):
        expect_error(lambda: self.linear(torch.randn(5, 6), torch.randn(3, 6), torch.randn(4)), r"bias", r"\b4\b", r"\b3\b")

    def test_rejects_weight_dtype_other_than_the_inputs(self):
        weight = torch.randn(3, 6, dtype=torch.float64)
        expect_error(lambda: self.linear(torch.randn(4, 6), weight, None), r"dtype", DTYPE_NAMES[torch.float64], DTYPE_NAMES[torch.float32])
