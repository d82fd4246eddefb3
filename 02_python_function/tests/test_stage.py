"""Stage 02's tests: the shared contracts (common/) for the Layer and the Function, and the
hand-written backward's own promises: only requested gradients, only needed tensors saved."""

import types

import pytest
import torch
from torch.autograd.gradcheck import GradcheckError

from eml.common.checks import FunctionTests, LayerTests, assert_close
from eml.ext.linear_python_function import Function, Layer


class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)
    double_backward = True  # the backward is built from differentiable operations


class TestFunction(FunctionTests):
    linear = staticmethod(Function.apply)
    double_backward = True


def call_backward(needs_input_grad):
    """Run Function.backward directly with a stand-in ctx, as autograd would."""
    input, weight, bias = torch.randn(4, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
    grad_output = torch.randn(4, 2, dtype=torch.float64)
    ctx = types.SimpleNamespace(needs_input_grad=needs_input_grad, input_shape=input.shape)
    ctx.save_for_backward = lambda *tensors: setattr(ctx, "saved_tensors", tensors)
    Function.forward(ctx, input, weight, bias)
    return ctx, Function.backward(ctx, grad_output), (input, weight, grad_output)


def test_backward_computes_only_what_is_asked():
    for needs in [(True, False, False), (False, True, False), (False, False, True), (False, True, True)]:
        _, grads, (input, weight, grad_output) = call_backward(needs)
        expected = [grad_output @ weight, grad_output.t() @ input, grad_output.sum(0)]
        for need, grad, want in zip(needs, grads, expected):
            if need:
                assert_close(grad, want, torch.float64, f"gradient for needs={needs}")
            else:
                assert grad is None, f"computed a gradient nobody asked for: needs={needs}"


def test_forward_saves_only_what_the_backward_needs():
    ctx, _, (input, weight, _) = call_backward((True, False, False))  # grad_input needs W only
    assert ctx.saved_tensors[0] is None and ctx.saved_tensors[1] is weight
    ctx, _, (input, weight, _) = call_backward((False, True, False))  # grad_weight needs x only
    assert ctx.saved_tensors[0] is input and ctx.saved_tensors[1] is None
    ctx, _, _ = call_backward((False, False, True))  # grad_bias needs neither
    assert ctx.saved_tensors == (None, None)


def test_wrong_backward_is_caught_by_gradcheck():
    """The safety net works: a backward whose grad_input is twice too large fails gradcheck."""

    class Wrong(Function):
        @staticmethod
        def backward(ctx, grad_output):
            grad_input, grad_weight, grad_bias = Function.backward(ctx, grad_output)
            return grad_input * 2, grad_weight, grad_bias  # the factor 2 is the bug

    input, weight = torch.randn(3, 4, dtype=torch.float64, requires_grad=True), torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(GradcheckError, match=r"Jacobian mismatch for output 0 with respect to input 0"):
        torch.autograd.gradcheck(Wrong.apply, (input, weight))


def test_same_initialisation_as_nn_linear_for_the_same_seed():
    torch.manual_seed(7)
    reference = torch.nn.Linear(10, 4)
    torch.manual_seed(7)
    layer = Layer(10, 4)
    assert_close(layer.weight, reference.weight, torch.float32, "weight")
    assert_close(layer.bias, reference.bias, torch.float32, "bias")
