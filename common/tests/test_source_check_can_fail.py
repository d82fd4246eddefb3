"""The no-matrix-product checks: the source check (stages 05-08, 16, 17) finds real calls and
ignores prose; the dispatch check (stages 05, 06, 07, 17) catches a product however it is spelled."""

import pathlib

import pytest
import torch
import torch.nn.functional as F

from eml.common.cpp_checks import (
    FORBIDDEN, assert_dispatches_no_matrix_product, code_only, dispatched_ops, matrix_product_calls,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_finds_the_calls_stage_04_makes():
    calls = {call.replace(" ", "") for call in matrix_product_calls(ROOT / "04_cpp_aten" / "src" / "FunctionCpp.cpp")}
    assert {"mm(", "addmm("} <= calls


def test_finds_calls_and_the_matmul_operator():
    assert FORBIDDEN.search(code_only("y = at::matmul(x, w); // at::mm( is fine in a comment", "//"))
    assert FORBIDDEN.search(code_only("y = x @ w.t()", "#"))
    assert FORBIDDEN.search(code_only("libxsmm_sgemm(&t, &t, &m)", "//"))
    assert FORBIDDEN.search(code_only("at::mm_out(out, x, w);", "//"))
    assert FORBIDDEN.search(code_only("at::_addmm_activation(b, x, w);", "//"))


def test_ignores_comments_strings_and_decorators():
    assert not FORBIDDEN.search(code_only('// at::mm(x, w)\nTORCH_CHECK(ok, "mm(");', "//"))
    assert not FORBIDDEN.search(code_only('/* torch::matmul(a, b) */ int x = 1;', "//"))
    assert not FORBIDDEN.search(code_only('    @staticmethod\n    def f(x):  # x.mm(w)\n        """x.mm(w)"""', "#"))


def test_the_dispatch_check_catches_products_however_spelled():
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    out = torch.empty(3, 5)
    for run in (lambda: F.linear(x, w).sum().backward(),      # a composite: its mm/addmm are seen
                lambda: torch.mm(x.detach(), w.detach().t(), out=out),
                lambda: torch.einsum("ij,kj->ik", x.detach(), w.detach())):
        with pytest.raises(AssertionError, match=r"an ATen matrix product ran: \['(addmm|mm|bmm)'"):
            assert_dispatches_no_matrix_product(run)


def test_the_dispatch_check_sees_inside_a_pybind11_extension():
    """Stage 04's C++ calls at::addmm and at::mm: the check sees them through the extension."""
    Layer = pytest.importorskip("eml.linear_cpp", reason="stage 04 is not installed").Layer  # pybind11 on ATen
    layer = Layer(4, 5)
    x = torch.randn(3, 4, requires_grad=True)
    assert {"addmm", "mm"} & set(dispatched_ops(lambda: layer(x).sum().backward()))
    with pytest.raises(AssertionError, match=r"an ATen matrix product ran"):
        assert_dispatches_no_matrix_product(lambda: layer(x).sum().backward())


def test_the_dispatch_check_passes_element_wise_work_and_refuses_an_empty_run():
    assert_dispatches_no_matrix_product(lambda: (torch.randn(3, 4) * 2).sum())
    with pytest.raises(AssertionError, match=r"dispatched no operator"):
        assert_dispatches_no_matrix_product(lambda: None)
