"""Stage 04's tests: the shared contracts (common/) for the Layer and the Function, and the C++
functions themselves: the course's two declarations called directly, only the requested
gradients computed, every message from C++'s check_inputs, one answer on 1 and 2 threads."""

import math

import pytest
import torch

from eml.common.checks import CASES, Case, FunctionTests, LayerTests, assert_close, expect_error, make_input
from eml.linear_cpp import Function, Layer, _C


class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)
    double_backward = False  # the backward is C++, outside autograd: once differentiable


class TestFunction(FunctionTests):
    linear = staticmethod(Function.apply)
    double_backward = False


def tensors(case, dtype=torch.float64, seed=0):
    """input (*, in), weight (out, in), bias (out), grad_output (*, out) for one shape."""
    generator = torch.Generator().manual_seed(seed)
    input = make_input(case, dtype, seed)
    weight = torch.randn(case.out_features, case.in_features, generator=generator, dtype=dtype)
    bias = torch.randn(case.out_features, generator=generator, dtype=dtype)
    grad_output = torch.randn(*case.leading, case.out_features, generator=generator, dtype=dtype)
    return input, weight, bias, grad_output


def expected_grads(input, weight, grad_output):
    """grad_input, grad_weight, grad_bias of y = x W^T + b, by torch's own matmul and sum."""
    n = math.prod(input.shape[:-1])  # reshape(-1, 0) would be ambiguous: give N explicitly
    grad_output_2d = grad_output.reshape(n, weight.shape[0])
    return (
        grad_output @ weight,
        grad_output_2d.t() @ input.reshape(n, weight.shape[1]),
        grad_output_2d.sum(0),
    )


# No input features (y = b, zero grad_input) or no output features (empty y, zero grad_input).
ZERO_FEATURES = [Case((4,), 0, 3), Case((4,), 3, 0)]


# -- the course's two C++ functions, called straight from the extension module ------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES + ZERO_FEATURES, ids=str)
def test_course_functions_called_directly(case, dtype):
    input, weight, _, grad_output = tensors(case, dtype)
    assert_close(_C.forward(input, weight), torch.nn.functional.linear(input, weight), dtype, "forward(input, weight)")
    grads = _C.backward(grad_output, input, weight)
    assert isinstance(grads, list) and len(grads) == 2, "backward returns [grad_input, grad_weight]"
    for name, grad, want in zip(["grad_input", "grad_weight"], grads, expected_grads(input, weight, grad_output)):
        assert grad.shape == want.shape, name
        assert_close(grad, want, dtype, name)


def test_course_functions_take_non_contiguous_tensors():
    input = torch.randn(9, 6, dtype=torch.float64).t()  # (6, 9), strides (1, 6)
    weight = torch.randn(9, 4, dtype=torch.float64).t()  # (4, 9)
    grad_output = torch.randn(4, 6, dtype=torch.float64).t()  # (6, 4)
    assert not (input.is_contiguous() or weight.is_contiguous() or grad_output.is_contiguous())
    assert_close(_C.forward(input, weight), input @ weight.t(), torch.float64, "forward")
    for grad, want in zip(_C.backward(grad_output, input, weight), expected_grads(input, weight, grad_output)):
        assert_close(grad, want, torch.float64, "backward")


def test_bias_overload_adds_the_bias():
    input, weight, bias, _ = tensors(CASES[7])
    assert_close(_C.forward(input, weight, bias), torch.nn.functional.linear(input, weight, bias), torch.float64, "with bias")
    assert_close(_C.forward(input, weight, None), input @ weight.t(), torch.float64, "bias None")


# -- needs_input_grad: only the gradients asked for, only the tensors they need ----------
NEEDS = [(True, False, False), (False, True, False), (False, False, True), (True, True, True), (False, True, True)]


@pytest.mark.parametrize("needs", NEEDS, ids=lambda n: "".join("xwb"[i] for i in range(3) if n[i]))
def test_backward_computes_only_what_is_asked(needs):
    input, weight, _, grad_output = tensors(CASES[7])
    need_input, need_weight, need_bias = needs
    # As Function.backward passes them: the input only when grad_weight needs it, and so on.
    grads = _C.backward(grad_output, input if need_weight else None, weight if need_input else None, *needs)
    for need, grad, want in zip(needs, grads, expected_grads(input, weight, grad_output)):
        if need:
            assert_close(grad, want, torch.float64, f"gradient for needs={needs}")
        else:
            assert grad is None, f"computed a gradient nobody asked for: needs={needs}"


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


def test_backward_refuses_a_missing_tensor_it_needs():
    input, weight, _, grad_output = tensors(CASES[7])
    expect_error(lambda: _C.backward(grad_output, None, weight, False, True, False), r"^linear_cpp:", r"grad_weight", r"input", r"None")
    expect_error(lambda: _C.backward(grad_output, input, None, True, False, False), r"^linear_cpp:", r"grad_input", r"weight", r"None")


# -- check_inputs: every message opens with the stage's name -----------------------------
def test_messages_name_the_stage_and_the_values():
    x, w, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(3)
    expect_error(lambda: _C.forward(x[..., :5], w), r"^linear_cpp: ", r"features", r"\b5\b", r"\b6\b")
    expect_error(lambda: _C.forward(torch.tensor(1.0), w), r"^linear_cpp: ", r"0-d")
    expect_error(lambda: _C.forward(x.long(), w), r"^linear_cpp: ", r"dtype", r"Long")
    expect_error(lambda: _C.forward(x, w.double()), r"^linear_cpp: ", r"dtype", r"Double", r"Float")
    expect_error(lambda: _C.forward(x, w, b.double()), r"^linear_cpp: ", r"bias", r"dtype", r"Double", r"Float")
    expect_error(lambda: _C.forward(x, w.to("meta")), r"^linear_cpp: ", r"weight", r"device", r"meta")
    expect_error(lambda: _C.forward(x, w, torch.randn(1, 3)), r"^linear_cpp: ", r"bias", r"\[1, 3\]", r"\b3\b")
    expect_error(lambda: _C.forward(x, w.reshape(3, 2, 3)), r"^linear_cpp: ", r"weight", r"dim", r"\b3\b")


def test_backward_checks_grad_output():
    x, w = torch.randn(4, 6), torch.randn(3, 6)
    expect_error(lambda: _C.backward(torch.randn(4, 5), x, w), r"^linear_cpp: ", r"grad_output", r"\b3\b", r"\b5\b")
    expect_error(lambda: _C.backward(torch.randn(2, 3), x, w), r"^linear_cpp: ", r"grad_output", r"\[4\]", r"\[2\]")
    expect_error(lambda: _C.backward(torch.randn(4, 3).double(), x, w), r"^linear_cpp: ", r"grad_output", r"dtype", r"Double")


# -- threads: ATen's matrix products follow torch.set_num_threads ------------------------
@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_same_result_on_one_and_two_threads(restore_threads):
    input, weight, bias, grad_output = tensors(CASES[8], torch.float32)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        grads = _C.backward(grad_output, input, weight, True, True, True)
        results.append([_C.forward(input, weight, bias), *grads])
    for name, one, two in zip(["output", "grad_input", "grad_weight", "grad_bias"], *results):
        assert_close(two, one, torch.float32, f"{name}, 2 threads against 1")
