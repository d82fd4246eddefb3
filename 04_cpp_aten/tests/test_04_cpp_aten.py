"""Stage 04's tests: the shared contracts (common/) for the Layer, the Function and the compiled
module (the course's two declarations called directly, only the requested gradients computed,
every message from C++'s check_inputs, one answer on 1 and 2 threads, one OpenMP runtime), and
what only this stage has: the Function telling C++ which gradients autograd wants."""

import pytest

from eml.common.checks import CASES, FunctionTests, LayerTests
from eml.common.cpp_checks import CppModuleTests, tensors
from eml.linear_cpp import Function, Layer, _C


class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)
    double_backward = False  # the backward is C++, outside autograd: once differentiable


class TestFunction(FunctionTests):
    linear = staticmethod(Function.apply)
    double_backward = False


class TestModule(CppModuleTests):
    prefix = "linear_cpp"
    module = _C

    def forward(self, input, weight, bias):
        return _C.forward(input, weight, bias)

    def backward(self, grad_output, input, weight, need_input, need_weight, need_bias):
        return _C.backward(grad_output, input, weight, need_input, need_weight, need_bias)


@pytest.mark.parametrize("requires", [(True, False, False), (False, True, False), (False, False, True), (True, True, True)])
def test_function_passes_needs_input_grad_to_cpp(requires, monkeypatch):
    """Through autograd: C++ is told exactly which gradients are wanted, and gets no extra tensor."""
    calls = []
    real_backward = _C.backward

    def spy(grad_output, input, weight, *needs):
        calls.append((input is not None, weight is not None, needs))
        return real_backward(grad_output, input, weight, *needs)

    monkeypatch.setattr(_C, "backward", spy)
    input, weight, bias, _ = tensors(CASES[7])
    for tensor, flag in zip([input, weight, bias], requires):
        tensor.requires_grad_(flag)
    Function.apply(input, weight, bias).sum().backward()
    need_input, need_weight, _ = requires
    assert calls == [(need_weight, need_input, requires)]
