"""Stage 04's tests: the shared contracts (common/) for the Layer, the Function and the compiled
module (the course's two declarations called directly, only the requested gradients computed,
every message from C++'s check_inputs, one answer on 1 and 2 threads, one OpenMP runtime), and
the Function telling C++ which gradients autograd wants; and that the decorator, not the C++,
is what refuses a second backward here."""

import pytest
import torch

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


class WithoutTheDecorator(Function):
    """The stage's Function with the body of its backward_once, undecorated (functools.wraps
    keeps the body as __wrapped__)."""

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        return Function.backward_once.__wrapped__(ctx, grad_output, input, weight)


def test_the_aten_backward_could_be_differentiated_twice():
    # Why the decorator is a choice in this stage (README): its at::mm calls are recorded by
    # autograd, so without once_differentiable the second derivatives are right.
    x, w, b = (torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in [(3, 4), (5, 4), (5,)])
    assert torch.autograd.gradgradcheck(WithoutTheDecorator.apply, (x, w, b))
    y = Function.apply(x, w, b)  # the stage's Function: the decorator refuses the second backward
    (grad_x,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="trying to differentiate twice"):
        grad_x.sum().backward()
