"""Stage 05's tests: the shared contracts (common/) for the Layer and the Function in both loop
orders, and the C++ loops themselves: the course's two declarations called directly, the two
loop orders against each other and the reference on awkward shapes, only the requested
gradients computed, every message from C++'s check_inputs, bitwise the same answer on 1 and 2
threads, no ATen matrix product anywhere in the source, and one OpenMP runtime in the process."""

import functools
import pathlib

import pytest
import torch

from eml.common.checks import FunctionTests, LayerTests, expect_error
from eml.common.cpp_checks import (
    AWKWARD, CppModuleTests, assert_dispatches_no_matrix_product, assert_no_matrix_product, assert_results_close,
    everything, expected_grads, tensors,
)
from eml.linear_cpp_naive import TOUR, Function, Layer, _C

STAGE = pathlib.Path(__file__).resolve().parents[1]  # 05_cpp_naive/, as shipped in the repository
LOOP_ORDERS = ["cache_aware", "textbook"]


class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)  # loop_order="cache_aware", the default
    double_backward = False  # once differentiable, the contract of the pybind11 C++ stages (04's README: why)


class TestLayerTextbook(TestLayer):
    make_layer = staticmethod(functools.partial(Layer, loop_order="textbook"))


class TestFunction(FunctionTests):
    linear = staticmethod(Function.apply)
    double_backward = False


class TestFunctionTextbook(TestFunction):
    linear = staticmethod(lambda input, weight, bias: Function.apply(input, weight, bias, "textbook"))


class TestModule(CppModuleTests):
    """The compiled module's contract (common/), in the default, cache-aware loop order."""

    prefix = "linear_cpp_naive"
    module = _C
    bitwise_across_threads = True  # each output element: one thread, one fixed summation order
    loop_order = "cache_aware"

    def forward(self, input, weight, bias):
        return _C.forward(input, weight, bias, self.loop_order)

    def backward(self, grad_output, input, weight, need_input, need_weight, need_bias):
        return _C.backward(grad_output, input, weight, need_input, need_weight, need_bias, self.loop_order)

    def apply(self, input, weight, bias):
        return Function.apply(input, weight, bias, self.loop_order), (self.loop_order,)


class TestModuleTextbook(TestModule):
    loop_order = "textbook"
    # The course's two functions take no loop order (they run the cache-aware loops): their
    # test is TestModule's, not repeated here.
    test_course_functions_called_directly = None


# -- the two loop orders: each other and the reference, on shapes that fit no vector width --
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", AWKWARD, ids=str)
def test_loop_orders_agree_with_each_other_and_the_reference(case, dtype):
    input, weight, bias, grad_output = tensors(case, dtype)
    reference = [torch.nn.functional.linear(input, weight, bias), *expected_grads(input, weight, grad_output)]
    results = {order: everything(_C, input, weight, bias, grad_output, order) for order in LOOP_ORDERS}
    assert_results_close(results["cache_aware"], results["textbook"], case, dtype, "cache_aware against textbook")
    assert_results_close(results["cache_aware"], reference, case, dtype, "cache_aware against torch")
    assert_results_close(results["textbook"], reference, case, dtype, "textbook against torch")


@pytest.mark.parametrize("loop_order", LOOP_ORDERS)
def test_loop_order_reaches_cpp_in_forward_and_backward(loop_order, monkeypatch):
    seen = []
    for name in ["forward", "backward"]:
        real = getattr(_C, name)
        monkeypatch.setattr(_C, name, lambda *args, _real=real, _name=name: seen.append((_name, args[-1])) or _real(*args))
    layer = Layer(5, 3, loop_order=loop_order)
    layer(torch.randn(2, 5)).sum().backward()
    assert seen == [("forward", loop_order), ("backward", loop_order)]
    assert f"loop_order={loop_order!r}" in repr(layer)


def test_unknown_loop_order_is_refused():
    expect_error(lambda: Layer(5, 3, loop_order="ikj"), r"^linear_cpp_naive: ", r"loop_order", r"cache_aware", r"ikj")
    x, w = torch.randn(2, 5), torch.randn(3, 5)
    expect_error(lambda: _C.forward(x, w, None, "ikj"), r"^linear_cpp_naive: ", r"loop_order", r"textbook", r"ikj")
    expect_error(lambda: _C.backward(torch.randn(2, 3), x, w, True, True, True, "ikj"), r"^linear_cpp_naive: ", r"ikj")


def test_tour_registers_both_loop_orders():
    layers = TOUR["layers"]
    assert all(len(label) <= 22 for label in layers), "the tour's table has 22 characters for a label"
    assert sorted(layer.loop_order for layer in (make(4, 2) for make in layers.values())) == sorted(LOOP_ORDERS)


def test_only_float_and_double_loops_exist():
    # The loops exist for float and double only; ATen's products would take these.
    x, w = torch.randn(4, 6), torch.randn(3, 6)
    expect_error(lambda: _C.forward(x.half(), w.half()), r"^linear_cpp_naive: ", r"dtype", r"Half")
    expect_error(lambda: _C.forward(x.bfloat16(), w.bfloat16()), r"^linear_cpp_naive: ", r"dtype", r"BFloat16")


# -- no ATen matrix product anywhere in this stage's source ------------------------------
def test_no_aten_matrix_product_in_the_source():
    assert_no_matrix_product(STAGE)  # common/tests shows this check finds stage 04's calls


@pytest.mark.parametrize("loop_order", LOOP_ORDERS)
def test_no_aten_matrix_product_runs(loop_order):
    """What the built module dispatches, forward and backward (the source check above sees only
    calls spelled out; common/tests shows this one sees stage 04's at::addmm through its module)."""
    layer = Layer(7, 5, loop_order=loop_order)
    x = torch.randn(2, 3, 7, requires_grad=True)
    assert_dispatches_no_matrix_product(lambda: layer(x).sum().backward())
