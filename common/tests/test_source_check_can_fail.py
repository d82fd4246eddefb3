"""The no-matrix-product source check (stages 05 and 06) finds real calls and ignores prose."""

import pathlib

from eml.common.cpp_checks import FORBIDDEN, code_only, matrix_product_calls

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_finds_the_calls_stage_04_makes():
    calls = {call.replace(" ", "") for call in matrix_product_calls(ROOT / "04_cpp_aten" / "src" / "FunctionCpp.cpp")}
    assert {"mm(", "addmm("} <= calls


def test_finds_calls_and_the_matmul_operator():
    assert FORBIDDEN.search(code_only("y = at::matmul(x, w); // at::mm( is fine in a comment", "//"))
    assert FORBIDDEN.search(code_only("y = x @ w.t()", "#"))
    assert FORBIDDEN.search(code_only("libxsmm_sgemm(&t, &t, &m)", "//"))


def test_ignores_comments_strings_and_decorators():
    assert not FORBIDDEN.search(code_only('// at::mm(x, w)\nTORCH_CHECK(ok, "mm(");', "//"))
    assert not FORBIDDEN.search(code_only('/* torch::matmul(a, b) */ int x = 1;', "//"))
    assert not FORBIDDEN.search(code_only('    @staticmethod\n    def f(x):  # x.mm(w)\n        """x.mm(w)"""', "#"))
