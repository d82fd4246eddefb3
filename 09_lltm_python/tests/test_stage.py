"""Stage 09's tests: the recurrent-cell contract (common/) for the module (autograd, so its
gradients can be differentiated again) and for the hand-written LLTMFunction; the derivative
helpers against autograd; a wrong backward caught by gradcheck."""

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from eml.common import lltm_bench
from eml.common.lltm_checks import CellTests, Shape, gradcheck_cell
from eml.lltm_python import TOUR, LLTM, LLTMFunction, LLTMWithFunction, compiled_lltm
from eml.lltm_python import lltm


class TestCell(CellTests):
    make_cell = staticmethod(LLTM)
    function = staticmethod(LLTMFunction.apply)
    prefix = "lltm_python"
    double_backward = True  # plain autograd all the way


class TestCellWithFunction(CellTests):
    make_cell = staticmethod(LLTMWithFunction)
    prefix = "lltm_python"
    no_function_reason = "LLTMFunction's own checks run in TestCell; this class checks the module on it"


@pytest.mark.parametrize("name, function", [("d_sigmoid", torch.sigmoid), ("d_tanh", torch.tanh),
                                            ("d_elu", torch.nn.functional.elu)])
def test_derivatives_match_autograd(name, function):
    z = torch.linspace(-4, 4, 101, dtype=torch.float64, requires_grad=True)
    (expected,) = torch.autograd.grad(function(z).sum(), z)
    torch.testing.assert_close(getattr(lltm, name)(z.detach()), expected)


def test_a_wrong_backward_is_caught_by_gradcheck(monkeypatch):
    # d_tanh written as 1 - tanh(z) (the square forgotten): gradcheck must say so.
    monkeypatch.setattr(lltm, "d_tanh", lambda z: 1 - z.tanh())
    with pytest.raises(GradcheckError, match=r"Jacobian mismatch"):
        gradcheck_cell(LLTMFunction.apply, Shape(3, 4, 5))


def test_the_compiled_cell_is_the_same_cell():
    """The benchmark's torch.compile row: LLTM under torch.compile, with LLTM's parameters and
    state_dict keys, matching the reference in float32 and passing gradcheck in float64."""
    cell = compiled_lltm(4, 5)
    assert list(cell.state_dict()) == list(LLTM(4, 5).state_dict())
    ok, line = lltm_bench.check_cell(compiled_lltm)
    assert ok, line
    assert TOUR["cells"]["09 python (torch.compile)"] is compiled_lltm
