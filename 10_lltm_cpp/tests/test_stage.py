"""Stage 10's tests: the recurrent-cell contract (common/) for the module and the Function, the
compiled module called directly (its seven forward results, d_X cut right when F != S, any
device ATen runs on), and both
build routes: setup.py (the installed _C) and JIT (jit.build() into a temporary folder)."""

import os

import torch

from eml.common.lltm_checks import CellTests, Shape, make_arguments, reference_lltm
from eml.lltm_cpp import LLTM, LLTMFunction, _C, jit


class TestCell(CellTests):
    make_cell = staticmethod(LLTM)
    function = staticmethod(LLTMFunction.apply)
    prefix = "lltm_cpp"
    double_backward = False  # the backward uses gates forward saved unrecorded: once differentiable


def test_forward_returns_the_seven_tensors():
    input, weights, bias, old_h, old_cell = make_arguments(Shape(4, 6, 5), torch.float64)
    outputs = _C.forward(input, weights, bias, old_h, old_cell)
    assert [tuple(t.shape) for t in outputs] == [(4, 5)] * 5 + [(4, 11), (4, 15)]
    new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights = outputs
    torch.testing.assert_close(X, torch.cat([old_h, input], 1))
    torch.testing.assert_close(gate_weights, torch.cat([old_h, input], 1) @ weights.t() + bias)
    expected = reference_lltm(input, weights, bias, old_h, old_cell)
    torch.testing.assert_close(new_h, expected[0])
    torch.testing.assert_close(new_cell, expected[1])


def test_backward_splits_d_x_at_the_state_size_when_f_differs_from_s():
    # F = 9, S = 4: split(S, dim=1) would give d_old_h 4 columns and d_input only 4 of its 9.
    arguments = make_arguments(Shape(3, 9, 4), torch.float64)
    new_h, new_cell, *saved = _C.forward(*arguments)
    grad_h, grad_cell = torch.ones_like(new_h), torch.zeros_like(new_cell)
    d_old_h, d_input, d_weights, d_bias, d_old_cell = _C.backward(grad_h, grad_cell, new_cell, *saved, arguments[1])
    assert d_old_h.shape == (3, 4) and d_input.shape == (3, 9) and d_bias.shape == (1, 12)
    leaves = [a.detach().requires_grad_() for a in arguments]
    reference_lltm(*leaves)[0].sum().backward()
    torch.testing.assert_close(d_input, leaves[0].grad)
    torch.testing.assert_close(d_old_h, leaves[3].grad)


def test_runs_on_any_device_aten_runs_on():
    # Only ATen calls, no data pointers: the same binary runs on CUDA tensors (stage 12's GPU
    # benchmark times it there). Without a GPU, the meta device (shapes, no data) shows it: every
    # result comes back on the inputs' device, with the right shape.
    arguments = [a.to("meta") for a in make_arguments(Shape(4, 6, 5), torch.float32)]
    new_h, new_cell, *saved = _C.forward(*arguments)
    assert [(t.device.type, tuple(t.shape)) for t in (new_h, new_cell, *saved)] == \
        [("meta", (4, 5))] * 5 + [("meta", (4, 11)), ("meta", (4, 15))]
    grads = _C.backward(torch.ones_like(new_h), torch.ones_like(new_cell), new_cell, *saved, arguments[1])
    assert [(t.device.type, tuple(t.shape)) for t in grads] == \
        [("meta", (4, 5)), ("meta", (4, 6)), ("meta", (15, 11)), ("meta", (1, 15)), ("meta", (4, 5))]


def build_in_background(folder):
    """The test below's JIT build, which the root conftest.py starts as the session begins, so
    that it compiles while other tests run (see there)."""
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    jit.build()


def test_jit_route_builds_the_same_module(background_builds, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(background_builds))
    module = jit.build()  # built by build_in_background above, or by this call
    assert str(background_builds) in module.__file__
    arguments = make_arguments(Shape(7, 13, 33), torch.float64)
    for built, installed in zip(module.forward(*arguments), _C.forward(*arguments)):
        torch.testing.assert_close(built, installed, rtol=0, atol=0)


def test_setup_py_route_is_a_compiled_module_in_the_package():
    assert _C.__name__ == "eml.lltm_cpp._C" and _C.__file__.endswith(".so")
