"""Stage 15's tests: one test (at least) for every claim the README and the notebook print.

__torch_function__: ScalarTensor (torch.mean and torch.add against the dense matrix, the three
changes to the "Extending PyTorch" notes' example, NotImplemented for unhandled functions and
unknown types, update_wrapper on the registered implementation, as the notes have them), a subclass
that keeps its type, a tagged subclass, a wrapper type, the override-coverage API.
__torch_dispatch__: the ATen operators of torch.nn.Linear and of the tutorial's own stages
(01: t, mm, add; 06: allocations and views only, its GEMMs run inside C++; 13: a torch.library operator
is one entry; 08 when installed: one registered operator), and what a wrapper subclass
cannot reach (an extension's raw memory).
"""

import pytest
import torch
import torch.nn.functional as F

from eml.tensor_subclasses import (
    HANDLED_FUNCTIONS, TOUR, KeepsType, LoggingMode, LoggingTensor, ScalarTensor, TaggedTensor, Wrapper, checks,
    coverage, dispatched_ops, logged_ops, matrix_products, scalar_tensor, subclass_ops, tagged,
)


# ---- 1. ScalarTensor and __torch_function__ -------------------------------------------------
@pytest.mark.parametrize("N, value", [(5, 2.0), (1, -3.5), (7, 0.0)])
def test_mean_matches_the_dense_matrix(N, value):
    s = ScalarTensor(N, value)
    result = torch.mean(s)
    assert isinstance(result, torch.Tensor), "torch.mean returns a tensor (the notes' mean returns a float)"
    torch.testing.assert_close(result, torch.mean(s.tensor()))
    for kwargs in ({"dim": 0}, {"dim": 1, "keepdim": True}, {"dim": (0, 1)}, {"dim": None, "keepdim": True}):
        torch.testing.assert_close(torch.mean(s, **kwargs), torch.mean(s.tensor(), **kwargs), msg=str(kwargs))
    wide = torch.mean(s, dtype=torch.float64)
    assert wide.dtype == torch.float64
    torch.testing.assert_close(wide, torch.mean(s.tensor(), dtype=torch.float64), rtol=1e-15, atol=0)


def test_mean_of_an_empty_matrix_is_nan_as_torch():
    assert torch.isnan(torch.mean(ScalarTensor(0, 1.0)))


def test_add_of_two_scalar_tensors_stays_a_scalar_tensor():
    result = torch.add(ScalarTensor(3, 2.0), ScalarTensor(3, 5.0))
    assert isinstance(result, ScalarTensor) and result._value == 7.0 and result._N == 3
    result = ScalarTensor(3, 2.0) + ScalarTensor(3, 5.0)
    assert isinstance(result, ScalarTensor) and result._value == 7.0


def test_add_honours_alpha():
    """The notes' add(input, other) has no alpha (torch.add(s, s, alpha=2) is a TypeError there): s + 2 s here."""
    result = torch.add(ScalarTensor(3, 2.0), ScalarTensor(3, 5.0), alpha=2)
    assert result._value == 12.0
    t = torch.randn(3, 3)
    torch.testing.assert_close(torch.add(ScalarTensor(3, 2.0), t, alpha=-1), 2.0 * torch.eye(3) - t)


def test_add_with_a_tensor_is_dense_on_both_sides():
    t = torch.randn(4, 4)
    torch.testing.assert_close(torch.add(ScalarTensor(4, 2.0), t), 2.0 * torch.eye(4) + t)
    torch.testing.assert_close(torch.add(t, ScalarTensor(4, 2.0)), t + 2.0 * torch.eye(4))
    torch.testing.assert_close(t + ScalarTensor(4, 2.0), t + 2.0 * torch.eye(4))  # Tensor.__add__, then __radd__


class Faulty(ScalarTensor):
    """A ScalarTensor with a bug: reading its value raises AttributeError."""

    @property
    def _value(self):
        raise AttributeError("Faulty has lost its value")

    @_value.setter
    def _value(self, value):
        pass

    def tensor(self):
        return torch.eye(self._N)


def test_add_lets_an_attribute_error_from_a_bug_surface():
    """The notes' add catches every AttributeError to mean "not a ScalarTensor"; isinstance decides here."""
    with pytest.raises(AttributeError, match="Faulty has lost its value"):
        torch.add(Faulty(2, 1.0), Faulty(2, 1.0))

    def notes_add(input, other):  # the notes' add, as they write it
        try:
            if input._N == other._N:
                return ScalarTensor(input._N, input._value + other._value)
            raise ValueError("Shape mismatch!")
        except AttributeError:
            return torch.add(scalar_tensor.ensure_tensor(input), scalar_tensor.ensure_tensor(other))

    # The same bug there: no error, a dense tensor computed from the faulty object's tensor().
    assert torch.equal(notes_add(Faulty(2, 1.0), Faulty(2, 1.0)), 2 * torch.eye(2))


def test_add_of_different_sizes_names_both():
    with pytest.raises(ValueError, match=r"N=3.*N=4"):
        torch.add(ScalarTensor(3, 1.0), ScalarTensor(4, 1.0))


def test_add_refuses_out_clearly():
    with pytest.raises(TypeError, match="out="):
        torch.add(ScalarTensor(2, 1.0), ScalarTensor(2, 1.0), out=torch.empty(2, 2))


def test_unhandled_function_is_a_type_error():
    """NotImplemented for a function not in HANDLED_FUNCTIONS: torch raises TypeError naming it."""
    with pytest.raises(TypeError, match=r"exp"):
        torch.exp(ScalarTensor(2, 1.0))
    with pytest.raises(TypeError, match=r"no implementation found for .torch\.nn\.functional\.relu."):
        torch.nn.functional.relu(ScalarTensor(2, 1.0))


def test_unknown_argument_type_is_refused():
    """The issubclass check: ScalarTensor does not act for a type it does not know."""
    seen = []

    class Other:
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return NotImplemented

    with pytest.raises(TypeError, match=r"torch\.add.*returned NotImplemented"):
        torch.add(ScalarTensor(2, 1.0), Other())
    assert seen == [torch.add], "torch asked the other type too once ScalarTensor declined"

    class Accepts(Other):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return "handled by Accepts"

    assert torch.add(ScalarTensor(2, 1.0), Accepts()) == "handled by Accepts"


def test_implements_uses_update_wrapper_on_the_implementation():
    implementation = HANDLED_FUNCTIONS[torch.mean]
    assert implementation is scalar_tensor.mean, "the decorator returns the function itself"
    assert implementation.__wrapped__ is torch.mean
    # What only update_wrapper gives: torch.mean's docstring, module and qualified name
    # (defined in scalar_tensor.py, the function would have its own).
    assert implementation.__doc__ == torch.mean.__doc__
    assert (implementation.__module__, implementation.__qualname__) == (torch.mean.__module__, torch.mean.__qualname__)


def test_scalar_tensor_rejects_a_bad_size():
    with pytest.raises(ValueError, match=r"-1"):
        ScalarTensor(-1, 1.0)


# ---- 2. The override-coverage API ------------------------------------------------------------
def test_every_handled_function_is_overridable_and_covered():
    overridable = coverage.overridable_in_torch()
    assert len(overridable) > 400  # torch.* alone: hundreds of functions
    assert set(HANDLED_FUNCTIONS) <= overridable
    assert coverage.missing_parameters() == {}
    line = coverage.report()
    assert line.startswith("handles 2 overridable functions of torch (torch.add, torch.mean)")
    assert "every parameter of torch's testing signatures accepted" in line


def test_coverage_catches_an_implementation_missing_a_parameter():
    """The check can fail: the notes' add(input, other) lacks torch.add's `out`."""
    def notes_add(input, other):
        return None

    assert coverage.missing_parameters({torch.add: notes_add}) == {"add": ["out"]}
    assert "missing" in coverage.report({torch.add: notes_add})


def test_ignored_functions_never_reach_torch_function():
    assert coverage.is_ignored(torch.tensor) and not coverage.is_ignored(torch.add)


# ---- 3. A subclass that keeps its type, a tagged one, a wrapper --------------------------------
def test_subclass_keeps_its_type_through_operations():
    x = torch.randn(3, 4).as_subclass(KeepsType)
    results = [x + 1, torch.relu(x), x.sum(), x @ x.t(), F.linear(x, torch.randn(2, 4)), x[0], x.view(4, 3)]
    assert [type(r) for r in results] == [KeepsType] * len(results)
    assert not isinstance(x.tolist(), torch.Tensor)  # not a tensor result: not converted


def test_plain_tensor_results_stay_plain():
    assert type(torch.randn(2) + 1) is torch.Tensor


def test_tagged_tensor_passes_its_tag_on_and_shares_memory():
    base = torch.randn(3)
    x = tagged(base, "metres")
    assert x.data_ptr() == base.data_ptr()
    y = torch.relu(x * 2) + torch.ones(3)
    assert type(y) is TaggedTensor and y.tag == "metres"
    plain = torch.randn(3).as_subclass(TaggedTensor)
    assert (plain + 1).tag is None


def test_wrapper_forwards_every_torch_function():
    Wrapper.calls.clear()
    x = torch.randn(4, 3)
    layer = torch.nn.Linear(3, 2)
    y = layer(Wrapper(x))
    assert type(y) is Wrapper
    torch.testing.assert_close(y.tensor, layer(x))
    # __torch_function__ sees the Python API call: one F.linear, not t + addmm
    assert dict(Wrapper.calls) == {"torch.nn.functional.linear": 1}


def test_wrapper_refuses_unknown_types():
    class Other:
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return NotImplemented

    with pytest.raises(TypeError, match=r"torch\.add.*returned NotImplemented"):
        torch.add(Wrapper(torch.ones(2)), Other())
    with pytest.raises(TypeError, match="Tensor"):
        Wrapper([1.0])


# ---- 4. __torch_dispatch__: what the tutorial's stages really run -----------------------------
X = torch.randn(4, 3)


def test_nn_linear_dispatches_t_and_addmm():
    forward, backward = dispatched_ops(torch.nn.Linear(3, 2), X)
    assert forward == ["aten.t.default", "aten.addmm.default"]
    assert backward.count("aten.mm.default") == 2 and "aten.sum.dim_IntList" in backward


def test_stage_01_dispatches_t_mm_add():
    linear_python = pytest.importorskip("eml.ext.linear_python", reason="stage 01 is not installed")
    forward, backward = dispatched_ops(linear_python.Layer(3, 2), X)
    assert forward == ["aten.t.default", "aten.mm.default", "aten.add.Tensor"]
    assert matrix_products(backward) == ["aten.mm.default", "aten.mm.default"]


def test_stage_01_through_the_wrapper_and_the_logging_tensor():
    linear_python = pytest.importorskip("eml.ext.linear_python", reason="stage 01 is not installed")
    layer = linear_python.Layer(3, 2)
    Wrapper.calls.clear()
    layer(Wrapper(X))
    assert [name for name in Wrapper.calls if not name.startswith("torch.Tensor.")] == ["torch.matmul", "torch.add"]
    # The subclass only sees what touches it: the weight's t() is missing.
    assert subclass_ops(layer, X) == ["aten.mm.default", "aten.add.Tensor"]


def test_stage_06_shows_allocations_but_no_matrix_product():
    linear_tpp = pytest.importorskip("eml.linear_tpp", reason="stage 06 is not installed")
    forward, backward = dispatched_ops(linear_tpp.Layer(3, 2), X)
    assert matrix_products(forward + backward) == [], "the GEMMs run in LIBXSMM's kernels, below the dispatcher"
    assert "aten.empty.memory_format" in forward, "C++'s own at::empty goes through the dispatcher, so the mode sees it"


def test_stage_06_cannot_run_on_a_wrapper_subclass():
    linear_tpp = pytest.importorskip("eml.linear_tpp", reason="stage 06 is not installed")
    with pytest.raises(RuntimeError, match="data is not allocated"):
        subclass_ops(linear_tpp.Layer(3, 2), X)


def test_stage_13_operator_is_one_entry_and_its_ctypes_route_refuses_the_subclass():
    c_ffi = pytest.importorskip("eml.c_ffi", reason="stage 13 is not installed")
    weight = torch.randn(2, 3)
    _, ops = logged_ops(c_ffi.ops.linear, X, weight)
    assert ops == ["eml_c_ffi.linear.default"]
    _, ops = logged_ops(c_ffi.LinearFunction.apply, X, weight)
    assert "aten.empty.memory_format" in ops and matrix_products(ops) == []
    with pytest.raises(TypeError, match="LoggingTensor"):
        c_ffi.LinearFunction.apply(LoggingTensor(X, []), weight)


def registered_ops(ops):
    return [op for op in ops if not op.startswith("aten.")]


def test_stage_08_is_one_registered_operator():
    linear_op = pytest.importorskip("eml.linear_op", reason="stage 08 (eml.linear_op) is not installed")
    forward, backward = dispatched_ops(linear_op.Layer(3, 2), X)
    assert matrix_products(forward + backward) == [], (forward, backward)
    assert registered_ops(forward) == ["eml.linear.default"], forward
    assert sorted(registered_ops(backward)) == [  # the README's right-hand column
        "eml.linear_grad_bias.default", "eml.linear_grad_input.default", "eml.linear_grad_weight.default"], backward


def test_logging_mode_sees_everything_and_restores():
    with LoggingMode() as mode:
        torch.ones(2).add_(1)
    assert mode.ops == ["aten.ones.default", "aten.add_.Tensor"]
    _, ops = logged_ops(lambda: torch.ones(2))
    assert ops == ["aten.ones.default"]


def test_logging_tensor_gives_the_right_answer_and_gradients():
    x = torch.randn(4, 3)
    layer = torch.nn.Linear(3, 2)
    log = []
    wrapped = LoggingTensor(x, log).requires_grad_()
    y = layer(wrapped)
    assert type(y) is LoggingTensor and log == ["aten.addmm.default"]
    torch.testing.assert_close(y.elem, layer(x))
    y.sum().backward()  # autograd runs above __torch_dispatch__: the backward's operators are logged too
    assert type(wrapped.grad) is LoggingTensor and log.count("aten.mm.default") == 2
    torch.testing.assert_close(wrapped.grad.elem, torch.ones(4, 2) @ layer.weight.detach())


# ---- 5. The tour's line -----------------------------------------------------------------------
def test_tour_check_passes():
    assert TOUR["checks"]["15 tensor subclasses"] is checks.tour_check
    ok, line = checks.tour_check()
    assert ok, line
    assert "nn.Linear dispatches aten.t.default + aten.addmm.default" in line


def test_tour_check_can_fail(monkeypatch):
    monkeypatch.setitem(HANDLED_FUNCTIONS, torch.mean, lambda input, dim=None: torch.tensor(0.0))
    ok, line = checks.tour_check()
    assert not ok and "WRONG" in line
