"""cpp_checks.assert_exports_no_symbol_of fails on a module that exports its C++: stage 05's _C,
built with default visibility, exports c10:: code it instantiated from the headers."""

import pytest

import eml.linear_cpp_naive._C as default_visibility
import eml.linear_tpp._C as hidden_visibility
from eml.common.cpp_checks import assert_exports_no_symbol_of


def test_hidden_module_passes():
    assert_exports_no_symbol_of(hidden_visibility.__file__, "tpp")


def test_default_visibility_module_is_caught():
    with pytest.raises(AssertionError, match=r"exports \d+ symbol\(s\) of namespace c10: "):
        assert_exports_no_symbol_of(default_visibility.__file__, "c10")
