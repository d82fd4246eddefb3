"""The recurrent-cell contract: every LLTM stage's tests inherit it.

The LLTM of PyTorch's "Custom C++ and CUDA Extensions" tutorial, for a batch of B rows,
F input features and a state of S:

    X = [old_h, input]                                   (B, S + F)
    gates = X W^T + b                                    W: (3S, S + F), b: (3S) or (1, 3S)
    input_gate, output_gate = sigmoid(gates[:, :S]), sigmoid(gates[:, S:2S])
    candidate_cell = elu(gates[:, 2S:])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = tanh(new_cell) * output_gate

A stage's test file sets what it has and inherits every check:

    from eml.common.lltm_checks import CellTests
    from eml.lltm_cpp import LLTM, LLTMFunction

    class TestCell(CellTests):
        make_cell = staticmethod(LLTM)                  # LLTM(input_features, state_size, device=, dtype=)
        function = staticmethod(LLTMFunction.apply)     # (input, weights, bias, old_h, old_cell) -> (h, c)
        prefix = "lltm_cpp"                             # every error message starts with it
        device = "cpu"                                  # "cuda" runs the same checks on a GPU

The reference is ``reference_lltm`` below: the formulas in plain torch ops, with autograd for
the five gradients (input, old_h, old_cell, weights, bias). common/ imports no stage, so the
reference lives here; it is the same maths as stage 09's module.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F

from eml.common import lltm_sequence

# ---------------------------------------------------------------------------------------
# 1. The reference
# ---------------------------------------------------------------------------------------


def reference_lltm(input, weights, bias, old_h, old_cell):
    """(new_h, new_cell) of the LLTM in plain torch ops; autograd differentiates it."""
    state_size = old_h.shape[1]
    X = torch.cat([old_h, input], dim=1)
    gates = F.linear(X, weights, bias.reshape(-1))
    input_gate = torch.sigmoid(gates[:, :state_size])
    output_gate = torch.sigmoid(gates[:, state_size:2 * state_size])
    candidate_cell = F.elu(gates[:, 2 * state_size:])
    new_cell = old_cell + candidate_cell * input_gate
    return torch.tanh(new_cell) * output_gate, new_cell


class ReferenceLLTM(torch.nn.Module):
    """The reference as a module (parameters ``weights`` and ``bias``), for the sequence check."""

    def __init__(self, input_features, state_size, device=None, dtype=None):
        super().__init__()
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size, device=device, dtype=dtype))
        stdv = 1.0 / math.sqrt(state_size)
        for parameter in self.parameters():
            parameter.data.uniform_(-stdv, +stdv)

    def forward(self, input, state):
        return reference_lltm(input, self.weights, self.bias, *state)


# ---------------------------------------------------------------------------------------
# 2. Shapes, tolerances, inputs
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    features: int
    state: int

    def __str__(self):
        return f"B{self.batch}xF{self.features}xS{self.state}"


SHAPES = [
    Shape(16, 32, 128),   # the tutorial's size
    Shape(1, 1, 1),       # the smallest cell there is
    Shape(1, 7, 13),      # batch 1, primes
    Shape(3, 5, 31),      # S one short of 32
    Shape(7, 13, 33),     # S one past 32: no vector width divides it
    Shape(5, 17, 9),      # F > S
    Shape(9, 32, 127),    # S prime, just under a power of two
    Shape(4, 100, 65),    # F != S, S = 64 + 1
    Shape(2, 3, 257),     # a long state row
    Shape(0, 5, 7),       # an empty batch: empty outputs, zero weight gradient
]

DTYPES = [torch.float32, torch.float64]

# float32: sums of up to ~770 products (d_X at S = 257) and a few transcendental functions.
TOLERANCES = {
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float64: dict(rtol=1e-10, atol=1e-12),
}

ARGUMENTS = ["input", "weights", "bias", "old_h", "old_cell"]
NAMES = ["new_h", "new_cell", "grad_input", "grad_weights", "grad_bias", "grad_old_h", "grad_old_cell"]


def make_arguments(shape: Shape, dtype=torch.float32, device="cpu", seed=0, bias_shape=None):
    """input (B, F), weights (3S, S+F), bias (3S), old_h (B, S), old_cell (B, S): leaves without grad."""
    B, Fe, S = shape.batch, shape.features, shape.state
    generator = torch.Generator().manual_seed(seed)
    shapes = [(B, Fe), (3 * S, S + Fe), bias_shape or (3 * S,), (B, S), (B, S)]
    scales = [1.0, 1.0 / math.sqrt(S + Fe), 0.5, 1.0, 1.0]  # gates of order one: every branch of elu is hit
    return [(torch.randn(*s, generator=generator, dtype=dtype) * k).to(device) for s, k in zip(shapes, scales)]


def outputs_and_grads(cell_fn, arguments, seed=1):
    """[new_h, new_cell, grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell] of one call
    of cell_fn(input, weights, bias, old_h, old_cell) on copies of the arguments."""
    leaves = [a.detach().requires_grad_() for a in arguments]  # detach keeps strides
    new_h, new_cell = cell_fn(*leaves)
    generator = torch.Generator().manual_seed(seed)
    grad_h, grad_cell = (torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in (new_h, new_cell))
    grads = torch.autograd.grad([new_h, new_cell], leaves, [grad_h, grad_cell], allow_unused=True)
    # grad order of NAMES: input, weights, bias, old_h, old_cell (the argument order)
    return [new_h.detach(), new_cell.detach(), *grads]


def module_as_function(cell):
    """cell(input, (old_h, old_cell)) as a function of all five tensors (weights and bias too)."""

    def run(input, weights, bias, old_h, old_cell):
        return torch.func.functional_call(cell, {"weights": weights, "bias": bias}, (input, (old_h, old_cell)))

    return run


def max_errors(cell_fn, shape: Shape, dtype=torch.float32, device="cpu", seed=0) -> dict:
    """Max absolute error of both outputs and the five gradients against the reference."""
    arguments = make_arguments(shape, dtype, device, seed)
    actual = outputs_and_grads(cell_fn, arguments)
    expected = outputs_and_grads(reference_lltm, arguments)
    return {name: (a - e).abs().max().item() if a is not None and a.numel() else (0.0 if a is not None else math.inf)
            for name, a, e in zip(NAMES, actual, expected)}


def gradcheck_cell(cell_fn, shape=Shape(3, 4, 5), device="cpu", seed=0) -> bool:
    """torch.autograd.gradcheck of cell_fn on float64 arguments; raises with the Jacobian on failure."""
    arguments = [a.requires_grad_() for a in make_arguments(shape, torch.float64, device, seed)]
    return torch.autograd.gradcheck(cell_fn, arguments, eps=1e-6, atol=1e-5, rtol=1e-4)


def assert_all_close(actual, expected, dtype, names=NAMES):
    for name, a, e in zip(names, actual, expected):
        assert a is not None, f"{name} was not computed"
        assert a.shape == e.shape, f"{name}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        assert a.dtype == e.dtype, f"{name}: dtype {a.dtype} != {e.dtype}"
        torch.testing.assert_close(a, e, **TOLERANCES[dtype], msg=lambda m: f"{name}: {m}")


# A dtype named the Python way (torch.float32) or the C++ way (Float).
DTYPE_NAMES = {
    torch.float32: r"(float32|\bFloat\b)",
    torch.float64: r"(float64|\bDouble\b)",
    torch.int64: r"(int64|\bLong\b)",
    torch.int32: r"(int32|\bInt\b)",
}

# Bad calls of function(input, weights, bias, old_h, old_cell) at B=3, F=5, S=7:
# {case: (changes to the good arguments, regular expressions the message must all match)}.
BAD_FUNCTION_INPUTS = {
    "1-D input": (dict(input=lambda t: t[0]), [r"input", r"(2-D|2D|dim)", r"\[5\]"]),
    "batch of old_h": (dict(old_h=lambda t: t[:2]), [r"old_h", r"batch", r"\b2\b", r"\b3\b"]),
    "batch of old_cell": (dict(old_cell=lambda t: t[:1]), [r"old_cell", r"batch", r"\b1\b", r"\b3\b"]),
    "state of old_cell": (dict(old_cell=lambda t: t[:, :6]), [r"old_cell", r"\b6\b", r"\b7\b"]),
    "state of old_h": (dict(old_h=lambda t: t[:, :6]), [r"(old_h|weights)", r"(\b6\b|\b11\b)", r"(\b7\b|\b12\b)"]),
    "feature count of weights": (dict(weights=lambda t: t[:, :11]), [r"(weights|feature)", r"(\b11\b|\b4\b)", r"(\b12\b|\b5\b)"]),
    "bias size": (dict(bias=lambda t: t[:20]), [r"bias", r"\b20\b", r"\b21\b"]),
    "integer input": (dict(input=lambda t: t.long()), [r"input", r"(dtype|float)", DTYPE_NAMES[torch.int64]]),
    "integer old_cell": (dict(old_cell=lambda t: t.int()), [r"old_cell", r"(dtype|float)", DTYPE_NAMES[torch.int32]]),
    "mixed dtypes": (dict(bias=lambda t: t.double()), [r"bias", DTYPE_NAMES[torch.float64], DTYPE_NAMES[torch.float32]]),
}


def expect_error(fn, patterns):
    """fn() must raise a Python exception whose message matches every pattern."""
    with pytest.raises((RuntimeError, ValueError, TypeError)) as info:
        fn()
    message = str(info.value)
    for pattern in patterns:
        assert re.search(pattern, message, flags=re.IGNORECASE), f"the error message does not say {pattern!r}:\n{message}"
    return message


# ---------------------------------------------------------------------------------------
# 3. The contract
# ---------------------------------------------------------------------------------------


class CellTests:
    """Every check an LLTM cell must pass.

    make_cell: LLTM(input_features, state_size, device=None, dtype=None), a module with
               parameters ``weights`` (3S, F+S) and ``bias`` (3S); forward(input, (old_h, old_cell)).
    function:  the stage's LLTMFunction.apply, or None.
    prefix:    text every error message contains (e.g. "lltm_cpp"), or None.
    device:    "cpu" or "cuda": where every tensor of the checks lives.
    double_backward: True when the module's gradients can be differentiated again (plain
               autograd); otherwise a second backward must raise a clear error. The Function's
               backward is hand-written: it must always refuse (once_differentiable).
    """

    make_cell = None
    function = None
    prefix = None
    device = "cpu"
    double_backward = False

    def cell(self, shape: Shape, dtype=torch.float32, seed=0):
        torch.manual_seed(seed)
        return self.make_cell(shape.features, shape.state).to(device=self.device, dtype=dtype)

    def arguments(self, shape, dtype=torch.float64, **kwargs):
        return make_arguments(shape, dtype, self.device, **kwargs)

    no_function_reason = "this stage has no LLTMFunction"  # what a skip of the Function's checks says

    def needs_function(self):
        if self.function is None:
            pytest.skip(self.no_function_reason)

    # -- the module ------------------------------------------------------------------------
    def test_parameters_as_the_tutorial(self):
        cell = self.make_cell(5, 7)
        assert isinstance(cell, torch.nn.Module)
        assert sorted(name for name, _ in cell.named_parameters()) == ["bias", "weights"]
        assert isinstance(cell.weights, torch.nn.Parameter) and isinstance(cell.bias, torch.nn.Parameter)
        assert cell.weights.shape == (21, 12) and cell.bias.shape == (21,)
        bound = 1 / math.sqrt(7)  # the tutorial: uniform(-1/sqrt(S), 1/sqrt(S)) for every parameter
        for parameter in cell.parameters():
            assert parameter.abs().max() <= bound
            assert parameter.std() > bound / 4, "the parameters look uninitialised"
        cell = self.make_cell(3, 4, device=self.device, dtype=torch.float64)
        assert cell.weights.dtype == cell.bias.dtype == torch.float64
        assert cell.weights.device.type == torch.device(self.device).type
        text = repr(self.make_cell(37, 11))
        assert "37" in text and "11" in text, f"the sizes are missing from {text!r}"

    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    def test_module_matches_reference(self, shape, dtype):
        cell = self.cell(shape, dtype)
        arguments = self.arguments(shape, dtype)
        arguments[1:3] = [cell.weights.detach(), cell.bias.detach()]
        assert_all_close(outputs_and_grads(module_as_function(cell), arguments),
                         outputs_and_grads(reference_lltm, arguments), dtype)

    def test_module_parameters_get_gradients(self):
        """backward() on the module fills .grad of its own parameters (what an optimizer reads)."""
        shape = Shape(4, 6, 5)
        cell = self.cell(shape, torch.float64)
        input, _, _, old_h, old_cell = self.arguments(shape)
        new_h, new_cell = cell(input, (old_h, old_cell))
        (new_h.sum() + new_cell.sum()).backward()
        leaves = [t.detach().requires_grad_() for t in (cell.weights, cell.bias)]
        h, c = reference_lltm(input, *leaves, old_h, old_cell)
        (h.sum() + c.sum()).backward()
        torch.testing.assert_close(cell.weights.grad, leaves[0].grad, **TOLERANCES[torch.float64])
        torch.testing.assert_close(cell.bias.grad, leaves[1].grad, **TOLERANCES[torch.float64])

    def test_module_gradcheck(self):
        cell = self.cell(Shape(3, 4, 5), torch.float64)
        assert gradcheck_cell(module_as_function(cell), Shape(3, 4, 5), self.device)

    def test_module_double_backward_or_clear_refusal(self):
        cell = self.cell(Shape(2, 3, 4), torch.float64)
        run = module_as_function(cell)
        arguments = [a.requires_grad_() for a in self.arguments(Shape(2, 3, 4))]
        self.check_double_backward(run, arguments, self.double_backward)

    def check_double_backward(self, run, arguments, supported):
        if supported:
            assert torch.autograd.gradgradcheck(run, arguments, eps=1e-6, atol=1e-5, rtol=1e-4)
            return
        new_h, new_cell = run(*arguments)
        grads = torch.autograd.grad(new_h.sum() + new_cell.sum(), arguments, create_graph=True)
        expect_error(lambda: sum(g.sum() for g in grads).backward(), [r"(once_differentiable|differentiate twice)"])

    def test_unrolled_sequence_follows_the_reference(self):
        """A few training steps on the sequence task (T=12, float64): the same losses as the reference."""
        kwargs = dict(steps=4, sequence_length=12, batch=3, features=4, state_size=5, dtype=torch.float64,
                      device=self.device)
        ours, _ = lltm_sequence.train(self.make_cell, **kwargs)
        reference, _ = lltm_sequence.train(ReferenceLLTM, **kwargs)
        assert ours[0] != ours[-1], "the loss did not move: no gradient reached the parameters"
        torch.testing.assert_close(torch.tensor(ours), torch.tensor(reference), rtol=1e-9, atol=1e-12)

    # -- the Function ------------------------------------------------------------------------
    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    def test_function_matches_reference(self, shape, dtype):
        self.needs_function()
        arguments = self.arguments(shape, dtype)
        assert_all_close(outputs_and_grads(self.function, arguments), outputs_and_grads(reference_lltm, arguments), dtype)

    def test_function_bias_of_shape_1_by_3s(self):
        self.needs_function()
        arguments = self.arguments(Shape(3, 5, 33), bias_shape=(1, 99))
        actual = outputs_and_grads(self.function, arguments)
        assert actual[4].shape == (1, 99), f"grad_bias has shape {tuple(actual[4].shape)}, the bias (1, 99)"
        assert_all_close(actual, outputs_and_grads(reference_lltm, arguments), torch.float64)

    @pytest.mark.parametrize("shape", [Shape(3, 4, 5), Shape(2, 7, 3), Shape(1, 3, 9)], ids=str)
    def test_function_gradcheck(self, shape):
        self.needs_function()
        assert gradcheck_cell(self.function, shape, self.device)

    def test_function_second_backward_refused(self):
        self.needs_function()
        arguments = [a.requires_grad_() for a in self.arguments(Shape(2, 3, 4))]
        self.check_double_backward(self.function, arguments, False)

    @pytest.mark.parametrize("wanted", [(0,), (1,), (2,), (3,), (4,), (1, 2), (0, 3, 4), (0, 1, 2, 3, 4)],
                             ids=lambda w: "+".join(ARGUMENTS[i] for i in w))
    def test_function_only_the_requested_gradients(self, wanted):
        self.needs_function()
        arguments = self.arguments(Shape(3, 5, 7))
        expected = outputs_and_grads(reference_lltm, arguments)
        for index in wanted:
            arguments[index].requires_grad_()
        new_h, new_cell = self.function(*arguments)
        (new_h * expected[0] + new_cell).sum().backward()  # any weighting will do
        for index, tensor in enumerate(arguments):
            if index in wanted:
                assert tensor.grad is not None, f"grad_{ARGUMENTS[index]} was asked for and not computed"
            else:
                assert tensor.grad is None, f"grad_{ARGUMENTS[index]} was computed though nobody asked"

    def test_function_non_contiguous_inputs(self):
        self.needs_function()
        arguments = self.arguments(Shape(6, 5, 33))
        strided = [torch.stack([a, a], dim=-1).flatten(-2)[..., ::2] for a in arguments]  # every other column: a again
        assert not any(s.is_contiguous() for s in strided)
        assert_all_close(outputs_and_grads(self.function, strided), outputs_and_grads(reference_lltm, arguments),
                         torch.float64)

    def test_same_result_on_one_and_two_threads(self):
        self.needs_function()
        if torch.device(self.device).type != "cpu":
            pytest.skip("threads are a CPU matter")
        # 130 rows: more than two of the fused stages' row chunks (each about 4096 elements, 63
        # rows at S = 65), so that two threads really split the passes.
        arguments = self.arguments(Shape(130, 13, 65), torch.float32)
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = outputs_and_grads(self.function, arguments)
            torch.set_num_threads(2)
            two = outputs_and_grads(self.function, arguments)
        finally:
            torch.set_num_threads(threads)
        assert_all_close(two, one, torch.float32)

    # -- bad input: a clear Python exception naming the problem and the value ---------------
    @pytest.mark.parametrize("case", sorted(BAD_FUNCTION_INPUTS))
    def test_function_rejects_bad_input(self, case):
        self.needs_function()
        changes, patterns = BAD_FUNCTION_INPUTS[case]
        arguments = dict(zip(ARGUMENTS, self.arguments(Shape(3, 5, 7), torch.float32)))
        for name, change in changes.items():
            arguments[name] = change(arguments[name])
        self.expect_error(lambda: self.function(*arguments.values()), patterns)

    def test_function_rejects_tensors_on_two_devices(self):
        self.needs_function()
        arguments = self.arguments(Shape(3, 5, 7), torch.float32)
        if torch.device(self.device).type == "cpu":
            arguments[3] = torch.empty(3, 7, device="meta")
            patterns = [r"old_h", r"(device|meta)", r"meta"]
        else:
            arguments[0] = arguments[0].cpu()
            patterns = [r"input", r"(device|cuda)", r"cpu"]
        self.expect_error(lambda: self.function(*arguments), patterns)

    def test_module_rejects_wrong_feature_count(self):
        cell = self.make_cell(5, 7).to(self.device)
        input, state = torch.randn(3, 4, device=self.device), (torch.zeros(3, 7, device=self.device),) * 2
        self.expect_error(lambda: cell(input, state), [r"(feature|weights)", r"(\b4\b|\b11\b)", r"(\b5\b|\b12\b)"])

    def test_module_rejects_input_dtype_other_than_its_parameters(self):
        cell = self.make_cell(5, 7).to(self.device)  # float32
        input = torch.randn(3, 5, dtype=torch.float64, device=self.device)
        state = (torch.zeros(3, 7, dtype=torch.float64, device=self.device),) * 2
        self.expect_error(lambda: cell(input, state), [DTYPE_NAMES[torch.float64], DTYPE_NAMES[torch.float32]])

    def test_module_rejects_state_of_another_size(self):
        cell = self.make_cell(5, 7).to(self.device)
        input, state = torch.randn(3, 5, device=self.device), (torch.zeros(3, 6, device=self.device),) * 2
        self.expect_error(lambda: cell(input, state), [r"(old_h|weights|state)", r"(\b6\b|\b11\b)", r"(\b7\b|\b12\b)"])

    def expect_error(self, fn, patterns):
        message = expect_error(fn, patterns)
        if self.prefix:
            assert self.prefix in message, f"the message does not name the stage {self.prefix!r}:\n{message}"
        return message
