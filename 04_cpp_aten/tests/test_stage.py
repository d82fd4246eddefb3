"""Stage 04's tests: the shared contracts (common/) for the Layer, the Function and the compiled
module (the course's two declarations called directly, only the requested gradients computed,
every message from C++'s check_inputs, one answer on 1 and 2 threads, one OpenMP runtime), and
the Function telling C++ which gradients autograd wants."""

from eml.common.checks import FunctionTests, LayerTests
from eml.common.cpp_checks import CppModuleTests
from eml.linear_cpp import Function, Layer, _C


class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)
    double_backward = False  # once differentiable, the contract of the pybind11 C++ stages (README: why)


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

    def apply(self, input, weight, bias):
        return Function.apply(input, weight, bias), ()  # C++'s backward gets only the three flags

