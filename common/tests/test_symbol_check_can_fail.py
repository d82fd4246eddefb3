"""cpp_checks.assert_exports_no_symbol_of fails on a module that exports its C++: stage 05's _C,
built with default visibility, exports c10:: code it instantiated from the headers.
cpp_checks.assert_imports_no_libtorch_cpp_symbol fails on a module built on ATen: stage 08's _C."""

import pytest

from eml.common.cpp_checks import assert_exports_no_symbol_of, assert_imports_no_libtorch_cpp_symbol


def test_hidden_module_passes():
    hidden_visibility = pytest.importorskip("eml.linear_tpp._C", reason="stage 06 is not installed")
    assert_exports_no_symbol_of(hidden_visibility.__file__, "tpp")


def test_default_visibility_module_is_caught():
    default_visibility = pytest.importorskip("eml.linear_cpp_naive._C", reason="stage 05 is not installed")
    with pytest.raises(AssertionError, match=r"exports \d+ symbol\(s\) of namespace c10: "):
        assert_exports_no_symbol_of(default_visibility.__file__, "c10")


def test_stable_abi_module_passes():
    stable = pytest.importorskip("eml.linear_stable._C", reason="stage 16 is not installed")
    assert_imports_no_libtorch_cpp_symbol(stable.__file__)


def test_aten_module_is_caught():
    aten = pytest.importorskip("eml.linear_op._C", reason="stage 08 is not installed")
    with pytest.raises(AssertionError, match=r"imports \d+ libtorch C\+\+ symbol\(s\), e\.g\. \[.*(at|c10)::"):
        assert_imports_no_libtorch_cpp_symbol(aten.__file__)
