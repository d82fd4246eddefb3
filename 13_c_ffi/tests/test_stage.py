"""Stage 13's tests: a plain C library reached through ctypes.

The linear Layer and Function pass the shared contracts of common/ (every awkward shape against
F.linear, gradcheck, double backward, bad input), through the autograd Function and through the
torch.library operator. New here: the old example's check model(x, 4x) == 5x, both gradients of add
from C, every bad input stopped in Python before C is reached (the library counts its calls),
the operators under opcheck and torch.compile(fullgraph=True), and the library itself: found by
path next to the package, no Python or PyTorch inside it, the ABI version checked.
"""

import ctypes
import pathlib
import re
import shutil
import subprocess
import types

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from eml.common.checks import FunctionTests, LayerTests, expect_error, gradcheck, gradgradcheck
from eml.c_ffi import TOUR, AddFunction, AddModule, Layer, LinearFunction, checks, clib, layer, ops


# ---- 1. The linear: the shared contracts, through the Function and through the operator ----
class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)
    double_backward = True  # the backward is LinearFunction again, so it is differentiable


class TestFunction(FunctionTests):
    linear = staticmethod(LinearFunction.apply)


class TestOperator(FunctionTests):
    linear = staticmethod(ops.linear)


@pytest.mark.parametrize("shape", [(1, 1, 1), (0, 5, 3), (37, 61, 53), (65, 129, 95), (2, 0, 4)], ids=str)
def test_linear_against_f_linear_float32(shape):
    rows, in_features, out_features = shape
    x, w, b = torch.randn(rows, in_features), torch.randn(out_features, in_features), torch.randn(out_features)
    torch.testing.assert_close(clib.linear_forward(x, w, b), F.linear(x, w, b), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(clib.linear_forward(x, w), F.linear(x, w), rtol=2e-5, atol=2e-5)


# ---- 2. add: the torch.utils.ffi example, fixed ----------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape", [(3, 7), (1,), (0, 4), (2, 3, 5)], ids=str)
def test_model_x_4x_is_5x(shape, dtype):
    """pytorch/extension-ffi's test.py prints model(x, 4x) beside x + 4x; asserted here: == 5x,
    exactly (one rounding each side, the same one)."""
    x = torch.randn(*shape, dtype=dtype)
    assert torch.equal(AddModule()(x, 4 * x), 5 * x)
    assert torch.equal(ops.add(x, 4 * x), 5 * x)


def test_add_gives_a_gradient_to_both_inputs_from_c():
    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    grad = torch.randn(4, 3)
    before = clib.calls()
    AddModule()(a, b).backward(grad)
    assert clib.calls() - before == 2, "one C call for the forward and one for the backward"
    assert torch.equal(a.grad, grad) and torch.equal(b.grad, grad)  # extension-ffi's backward returned one only


@pytest.mark.parametrize("needs", [(True, False), (False, True), (False, False)], ids=["a", "b", "neither"])
def test_add_gradient_only_where_asked(needs):
    """The backward itself, with a stand-in ctx: it returns None for an input nobody asked about
    (autograd would drop such a gradient anyway, so a real backward pass could not show it), and
    calls C only when some gradient is asked for."""
    ctx = types.SimpleNamespace(needs_input_grad=needs)
    before = clib.calls()
    grads = AddFunction.backward(ctx, torch.randn(5))
    assert [g is not None for g in grads] == list(needs)
    assert clib.calls() - before == int(any(needs))


@pytest.mark.parametrize("add", [AddFunction.apply, ops.add], ids=["Function", "operator"])
def test_add_gradcheck_float64(add):
    a, b = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert gradcheck(add, a, b)


def test_add_function_is_twice_differentiable():
    """The gradients come from C through AddBackwardFunction, whose backward is the add again: a
    second derivative includes the add's part (with C's gradients called bare, d2 here is 1, not 3)."""
    a, b = (torch.randn(3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert gradgradcheck(lambda a, b: AddFunction.apply(a, b) ** 2, a, b)
    (grad_a,) = torch.autograd.grad((AddFunction.apply(a, b) ** 2).sum(), a, create_graph=True)  # 2 (a + b)
    (d2,) = torch.autograd.grad((grad_a + a).sum(), a)
    torch.testing.assert_close(d2, torch.full_like(a, 3.0))


def test_operator_add_refuses_double_backward_by_name():
    a, b = (torch.randn(3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    (grad_a,) = torch.autograd.grad((ops.add(a, b) ** 2).sum(), a, create_graph=True)
    with pytest.raises(RuntimeError, match="add_backward.default but no autograd formula was registered"):
        torch.autograd.grad((grad_a + a).sum(), a)


def test_add_on_views_reads_the_right_memory():
    """Zero copy: C gets data_ptr(), which includes a view's storage offset; strided views are made contiguous."""
    base = torch.arange(20.0)
    assert torch.equal(clib.add_forward(base[5:9], base[10:14]), base[5:9] + base[10:14])
    wide = torch.randn(6, 4)
    assert torch.equal(layer.add(wide.t(), wide.t()), 2 * wide.t())
    out = clib.add_forward(base, base)
    assert out.data_ptr() != base.data_ptr()  # a new output, the inputs untouched
    assert torch.equal(base, torch.arange(20.0))


# ---- 3. Bad inputs: stopped in Python, C never reached ---------------------------------------
def f32(*shape):
    return torch.ones(*shape)


BAD_RAW = {  # clib: the raw calls, each with the words its message must contain
    "add shapes differ": (lambda: clib.add_forward(f32(4), f32(5)), [r"shape", r"\[4\]", r"\[5\]"]),
    "add dtypes differ": (lambda: clib.add_forward(f32(4), f32(4).double()), [r"same dtype", r"torch\.float32, got dtype torch\.float64"]),
    "add integer": (lambda: clib.add_forward(f32(4).int(), f32(4).int()), [r"dtype", r"int32"]),
    "add half": (lambda: clib.add_forward(f32(4).half(), f32(4).half()), [r"dtype", r"float16"]),
    "add not contiguous": (lambda: clib.add_forward(f32(3, 4).t(), f32(3, 4).t()), [r"contiguous", r"strides", r"\[1, 4\]"]),
    "add meta device": (lambda: clib.add_forward(f32(4).to("meta"), f32(4).to("meta")), [r"CPU", r"meta"]),
    "add not a tensor": (lambda: clib.add_forward([1.0], f32(1)), [r"torch.Tensor", r"list"]),
    "backward not contiguous": (lambda: clib.add_backward(f32(3, 4).t()), [r"grad_out", r"contiguous"]),
    "linear features differ": (lambda: clib.linear_forward(f32(2, 3), f32(4, 5)), [r"features", r"\b3\b", r"\b5\b"]),
    "linear 3-d input": (lambda: clib.linear_forward(f32(2, 2, 3), f32(4, 3)), [r"input", r"2-d", r"3-d"]),
    "linear 1-d weight": (lambda: clib.linear_forward(f32(2, 3), f32(3)), [r"weight", r"2-d", r"1-d"]),
    "linear bias size": (lambda: clib.linear_forward(f32(2, 3), f32(4, 3), f32(5)), [r"bias", r"\[4\]", r"\[5\]"]),
    "linear weight not contiguous": (lambda: clib.linear_forward(f32(2, 3), f32(3, 4).t()), [r"weight", r"contiguous"]),
    "linear bias dtype": (lambda: clib.linear_forward(f32(2, 3), f32(4, 3), f32(4).double()), [r"bias must have the same dtype", r"got dtype torch\.float64"]),
}

BAD_WRAPPED = {  # the Function, Module and operator: the same checks one level up
    "Function add shapes": (lambda: AddFunction.apply(f32(4), f32(2, 2)), [r"shape", r"\[4\]", r"\[2, 2\]"]),
    "Module add dtype": (lambda: AddModule()(f32(4), f32(4).double()), [r"same dtype", r"got torch\.float32 and torch\.float64"]),
    "operator add device": (lambda: ops.add(f32(4).to("meta"), f32(4).to("meta")), [r"CPU", r"meta"]),
    "operator linear features": (lambda: ops.linear(f32(2, 3), f32(4, 5)), [r"features", r"\b3\b", r"\b5\b"]),
    "Layer 0-d input": (lambda: Layer(1, 3)(torch.tensor(1.0)), [r"0-d"]),
    "Layer int64 input": (lambda: Layer(3, 2)(f32(2, 3).long()), [r"dtype", r"int64"]),
}


@pytest.mark.parametrize("name", list(BAD_RAW) + list(BAD_WRAPPED))
def test_bad_input_is_stopped_before_c(name):
    call, patterns = {**BAD_RAW, **BAD_WRAPPED}[name]
    before = clib.calls()
    expect_error(call, *patterns)
    assert clib.calls() == before, f"{name}: the C library was called although the input was bad"


def test_the_call_counter_can_see_a_call():
    """The guard above can fail: a good call does move the counter (and reset_calls resets it)."""
    clib.reset_calls()
    clib.add_forward(f32(3), f32(3))
    clib.linear_forward(f32(2, 3), f32(4, 3))
    assert clib.calls() == 2
    clib.reset_calls()
    assert clib.calls() == 0


def test_no_pointer_is_passed_when_a_check_fails(monkeypatch):
    """A second witness besides the counter: data_ptr() is never even asked for."""
    asked = []
    monkeypatch.setattr(clib, "_ptr", lambda tensor: asked.append(tensor) or tensor.data_ptr())
    with pytest.raises(ValueError, match=r"same shape, got \[4\] and \[5\]"):
        clib.add_forward(f32(4), f32(5))
    assert asked == []
    clib.add_forward(f32(4), f32(4))
    assert len(asked) == 3


# ---- 4. The operators under opcheck and torch.compile ------------------------------------------
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_opcheck_linear(bias):
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True) if bias else None
    torch.library.opcheck(ops.linear, (x, w, b))


def test_opcheck_add():
    a, b = (torch.randn(3, 4, requires_grad=True) for _ in range(2))
    torch.library.opcheck(ops.add, (a, b))
    torch.library.opcheck(ops.add_backward, (torch.randn(3, 4),))


class Model(torch.nn.Module):
    """A model that calls both operators: linear(x + 4x) with a C add and a C linear."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 7, dtype=torch.float64))
        self.bias = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))

    def forward(self, x):
        return ops.linear(ops.add(x, 4 * x), self.weight, self.bias)


def test_torch_compile_fullgraph_forward_and_backward():
    """No graph break (fullgraph=True raises on one); the compiled model gives eager's answers and still runs C.

    The default backend (Inductor), as a user would call it: it compiles the code around the
    two opaque operators with a C++ compiler, once per fresh cache (slow the first time)."""
    torch._dynamo.reset()
    model = Model()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    expected = F.linear(5 * x, model.weight, model.bias)
    (grad_x_expected, grad_w_expected) = torch.autograd.grad(expected.sum(), [x, model.weight])
    before = clib.calls()
    output = compiled(x)
    grad_x, grad_w = torch.autograd.grad(output.sum(), [x, model.weight])
    assert clib.calls() - before == 5, "forward: add and linear; backward: add_backward and two linears"
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(grad_x, grad_x_expected)
    torch.testing.assert_close(grad_w, grad_w_expected)


def test_torch_compile_cannot_trace_the_plain_ctypes_call():
    """Why ops.py exists: Dynamo cannot trace a ctypes function pointer, so fullgraph=True fails there."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: LinearFunction.apply(x, w), fullgraph=True, backend="aot_eager")
    with pytest.raises(torch._dynamo.exc.Unsupported, match="_FuncPtr"):
        compiled(torch.randn(2, 3), torch.randn(4, 3))
    torch._dynamo.reset()


def test_torch_compile_rejects_bad_shapes_while_tracing():
    """The fake functions run the same checks: the error appears at trace time, before C. Dynamo
    wraps an error raised on fake tensors in TorchRuntimeError; without the fake function's check
    the trace would pass and the real operator's ValueError come only when the compiled code runs."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: ops.linear(x, w, None), fullgraph=True, backend="aot_eager")
    before = clib.calls()
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=r"input has 3 features .* expects 5 in_features"):
        compiled(torch.randn(2, 3), torch.randn(4, 5))
    with FakeTensorMode():  # the fake function alone, on tensors without memory
        with pytest.raises(ValueError, match=r"input has 3 features .* expects 5 in_features"):
            ops.linear(torch.randn(2, 3), torch.randn(4, 5), None)
    assert clib.calls() == before


# ---- 5. The library itself ---------------------------------------------------------------------
@pytest.mark.skipif(not pathlib.Path("/proc/self/maps").exists(), reason="/proc/self/maps is Linux's")
def test_library_is_found_next_to_the_package():
    assert clib.LIBRARY_PATH.parent == pathlib.Path(clib.__file__).resolve().parent
    assert clib.LIBRARY_PATH.name == "libeml_add.so"
    # The copy this process really mapped, as the kernel lists it: the package's own, by its full
    # path, whatever LD_LIBRARY_PATH holds.
    mapped = {line.split()[-1] for line in pathlib.Path("/proc/self/maps").read_text().splitlines()
              if line.rstrip().endswith("libeml_add.so")}
    assert mapped == {str(clib.LIBRARY_PATH.resolve())}, mapped


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None, reason="needs binutils' nm and readelf")
def test_library_is_plain_c_without_python_or_torch():
    """Judged on the built library, not its source: no PyInit_ entry point, no shared library
    beyond the C runtime, and no symbol of Python, ATen, c10 or torch left to resolve."""
    path = str(clib.LIBRARY_PATH)
    lib = ctypes.CDLL(path)
    assert not hasattr(lib, "PyInit_libeml_add"), "a plain C library, not a Python extension module"
    dynamic = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    assert needed <= {"libc.so.6", "libm.so.6"}, needed
    undefined = subprocess.run(["nm", "-D", "--undefined-only", path], check=True, capture_output=True,
                               text=True).stdout.split()
    foreign = [name for name in undefined if name.startswith(("Py", "_Py", "_ZN2at", "_ZN3c10", "_ZN5torch"))]
    assert not foreign, foreign


def test_a_library_of_another_abi_version_is_refused(monkeypatch):
    monkeypatch.setattr(clib, "ABI_VERSION", 99)
    expect_error_import = pytest.raises(ImportError, match=r"ABI version 1.*expects 99")
    with expect_error_import:
        clib._load(clib.LIBRARY_PATH)


def test_a_missing_library_is_a_clear_import_error(tmp_path):
    with pytest.raises(ImportError, match=r"missing.*reinstall 13_c_ffi"):
        clib._load(tmp_path / "libeml_add.so")


# ---- 6. The tour's line -----------------------------------------------------------------------
def test_tour_check_passes_and_names_each_lesson():
    assert TOUR["checks"]["13 c ffi"] is checks.tour_check
    ok, line = checks.tour_check()
    assert ok, line
    for fragment in ("model(x, 4x) == 5x: yes", "gradcheck", "pass", "6/6", "C calls made by them: 0"):
        assert fragment in line


def test_tour_check_can_fail(monkeypatch):
    class OffByOne(torch.nn.Module):
        def forward(self, a, b):
            return AddFunction.apply(a, b) + 1

    monkeypatch.setattr(checks, "AddModule", OffByOne)
    ok, line = checks.tour_check()
    assert not ok and "5x: NO" in line
