"""Stage 05's tests: the shared contracts (common/) for the Layer and the Function in both loop
orders, and the C++ loops themselves: the course's two declarations called directly, the two
loop orders against each other and the reference on awkward shapes, only the requested
gradients computed, every message from C++'s check_inputs, bitwise the same answer on 1 and 2
threads, no ATen matrix product anywhere in the source, and one OpenMP runtime in the process."""

import functools
import math
import pathlib
import re
import sys

import pytest
import torch

from eml.common.checks import CASES, Case, FunctionTests, LayerTests, assert_close, expect_error, make_input
from eml.linear_cpp_naive import TOUR, Function, Layer, _C

STAGE = pathlib.Path(__file__).resolve().parents[1]  # 05_cpp_naive/, as shipped in the repository
LOOP_ORDERS = ["cache_aware", "textbook"]


class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)  # loop_order="cache_aware", the default
    double_backward = False  # the backward is C++, outside autograd: once differentiable


class TestLayerTextbook(TestLayer):
    make_layer = staticmethod(functools.partial(Layer, loop_order="textbook"))


class TestFunction(FunctionTests):
    linear = staticmethod(Function.apply)
    double_backward = False


class TestFunctionTextbook(TestFunction):
    linear = staticmethod(lambda input, weight, bias: Function.apply(input, weight, bias, "textbook"))


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


def everything(input, weight, bias, grad_output, loop_order):
    """output and the three gradients of one loop order, straight from the extension."""
    return [_C.forward(input, weight, bias, loop_order), *_C.backward(grad_output, input, weight, True, True, True, loop_order)]


NAMES = ["output", "grad_input", "grad_weight", "grad_bias"]


# -- the course's two C++ functions, called straight from the extension module ------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
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


# -- the two loop orders: each other and the reference, on shapes that fit no vector width --
AWKWARD = [
    Case((1823,), 31, 7),      # a tall batch, few features (the Triton tutorials' 1823)
    Case((3,), 781, 129),      # wide rows: a row of W spans many cache lines
    Case((5, 7, 3), 67, 257),  # three leading dimensions, odd sizes everywhere
    Case((0,), 9, 4),          # nothing to do: empty output, zero weight gradient
    Case((), 1, 300),          # 1-D input, one input feature
    Case((4,), 0, 3),          # no input features: y = b, grad_input empty
    Case((4,), 3, 0),          # no output features: y empty, grad_input zero
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", AWKWARD, ids=str)
def test_loop_orders_agree_with_each_other_and_the_reference(case, dtype):
    input, weight, bias, grad_output = tensors(case, dtype)
    reference = [torch.nn.functional.linear(input, weight, bias), *expected_grads(input, weight, grad_output)]
    results = {order: everything(input, weight, bias, grad_output, order) for order in LOOP_ORDERS}
    for name, cache_aware, textbook, want in zip(NAMES, results["cache_aware"], results["textbook"], reference):
        assert cache_aware.shape == textbook.shape == want.shape, name
        assert_close(cache_aware, textbook, dtype, f"{name}: cache_aware against textbook")
        assert_close(cache_aware, want, dtype, f"{name}: cache_aware against torch")
        assert_close(textbook, want, dtype, f"{name}: textbook against torch")


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


# -- needs_input_grad: only the gradients asked for, only the tensors they need ----------
NEEDS = [(True, False, False), (False, True, False), (False, False, True), (True, True, True), (False, True, True)]


@pytest.mark.parametrize("loop_order", LOOP_ORDERS)
@pytest.mark.parametrize("needs", NEEDS, ids=lambda n: "".join("xwb"[i] for i in range(3) if n[i]))
def test_backward_computes_only_what_is_asked(needs, loop_order):
    input, weight, _, grad_output = tensors(CASES[7])
    need_input, need_weight, need_bias = needs
    # As Function.backward passes them: the input only when grad_weight needs it, and so on.
    grads = _C.backward(grad_output, input if need_weight else None, weight if need_input else None, *needs, loop_order)
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

    def spy(grad_output, input, weight, *needs_and_order):
        calls.append((input is not None, weight is not None, needs_and_order[:3]))
        return real_backward(grad_output, input, weight, *needs_and_order)

    monkeypatch.setattr(_C, "backward", spy)
    input, weight, bias, _ = tensors(CASES[7])
    for tensor, flag in zip([input, weight, bias], requires):
        tensor.requires_grad_(flag)
    Function.apply(input, weight, bias).sum().backward()
    need_input, need_weight, _ = requires
    assert calls == [(need_weight, need_input, requires)]


def test_backward_refuses_a_missing_tensor_it_needs():
    input, weight, _, grad_output = tensors(CASES[7])
    expect_error(lambda: _C.backward(grad_output, None, weight, False, True, False), r"^linear_cpp_naive:", r"grad_weight", r"input", r"None")
    expect_error(lambda: _C.backward(grad_output, input, None, True, False, False), r"^linear_cpp_naive:", r"grad_input", r"weight", r"None")


# -- check_inputs: every message opens with the stage's name -----------------------------
def test_messages_name_the_stage_and_the_values():
    x, w, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(3)
    expect_error(lambda: _C.forward(x[..., :5], w), r"^linear_cpp_naive: ", r"features", r"\b5\b", r"\b6\b")
    expect_error(lambda: _C.forward(torch.tensor(1.0), w), r"^linear_cpp_naive: ", r"0-d")
    expect_error(lambda: _C.forward(x.long(), w), r"^linear_cpp_naive: ", r"dtype", r"Long")
    expect_error(lambda: _C.forward(x, w.double()), r"^linear_cpp_naive: ", r"dtype", r"Double", r"Float")
    expect_error(lambda: _C.forward(x, w, b.double()), r"^linear_cpp_naive: ", r"bias", r"dtype", r"Double", r"Float")
    expect_error(lambda: _C.forward(x, w.to("meta")), r"^linear_cpp_naive: ", r"weight", r"device", r"meta")
    expect_error(lambda: _C.forward(x, w, torch.randn(1, 3)), r"^linear_cpp_naive: ", r"bias", r"\[1, 3\]", r"\b3\b")
    expect_error(lambda: _C.forward(x, w.reshape(3, 2, 3)), r"^linear_cpp_naive: ", r"weight", r"dim", r"\b3\b")
    # The loops exist for float and double only; ATen's products would take these.
    expect_error(lambda: _C.forward(x.half(), w.half()), r"^linear_cpp_naive: ", r"dtype", r"Half")
    expect_error(lambda: _C.forward(x.bfloat16(), w.bfloat16()), r"^linear_cpp_naive: ", r"dtype", r"BFloat16")


def test_backward_checks_grad_output():
    x, w = torch.randn(4, 6), torch.randn(3, 6)
    expect_error(lambda: _C.backward(torch.randn(4, 5), x, w), r"^linear_cpp_naive: ", r"grad_output", r"\b3\b", r"\b5\b")
    expect_error(lambda: _C.backward(torch.randn(2, 3), x, w), r"^linear_cpp_naive: ", r"grad_output", r"\[4\]", r"\[2\]")
    expect_error(lambda: _C.backward(torch.randn(4, 3).double(), x, w), r"^linear_cpp_naive: ", r"grad_output", r"dtype", r"Double")


# -- threads: at::parallel_for follows torch.set_num_threads -----------------------------
@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("loop_order", LOOP_ORDERS)
def test_bitwise_same_result_on_one_and_two_threads(loop_order, restore_threads):
    # Big enough to be split over threads (grain: 32768 multiply-adds per thread).
    input, weight, bias, grad_output = tensors(Case((130,), 129, 257), torch.float32)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append(everything(input, weight, bias, grad_output, loop_order))
    for name, one, two in zip(NAMES, *results):
        # Each output element is summed by one thread in one fixed order: no rounding differs.
        assert torch.equal(one, two), f"{name}: 2 threads differ from 1"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps is Linux's")
def test_one_openmp_runtime_in_the_process(restore_threads):
    """The two-OpenMP trap: -fopenmp only at compile time, so _C uses the libgomp torch loaded."""
    torch.set_num_threads(2)
    input, weight, bias, grad_output = tensors(Case((130,), 129, 257), torch.float32)
    everything(input, weight, bias, grad_output, "cache_aware")  # run a parallel region first
    with open("/proc/self/maps") as maps:
        runtimes = {line.split()[-1] for line in maps if re.search(r"lib(g|i)omp", line)}
    assert len(runtimes) <= 1, f"two OpenMP runtimes in one process: {sorted(runtimes)}"
    # The cause, not only the symptom: _C names no OpenMP library of its own to load.
    assert b"libgomp" not in pathlib.Path(_C.__file__).read_bytes(), "_C is linked against a libgomp: drop -fopenmp from the link"


# -- no ATen matrix product anywhere in this stage's source ------------------------------
# ATen's and BLAS's matrix products as a call, e.g. at::mm(, .matmul(, cblas_sgemm(, and
# Python's matrix-multiply operator x @ w (a decorator's @ starts its line, so it is not one).
FORBIDDEN = re.compile(
    r"\b(mm|matmul|addmm|addmv|mv|bmm|baddbmm|addbmm|linear|einsum|dot|vdot|inner|outer|tensordot|"
    r"chain_matmul|\w*gemm\w*)\s*\(|[\w)\]][ \t]*@(?!=)"
)


def code_only(text, comment):
    """Source text without comments and string literals: prose may say 'dot product'."""
    if comment == "#":
        text = re.sub(r'"""(.|\n)*?"""', "", text)  # docstrings
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)  # string literals, one line each
    if comment == "//":
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # /* block */ and /*label=*/ comments
    return re.sub(rf"{re.escape(comment)}.*", "", text)


def forbidden_calls(path):
    comment = "//" if path.suffix == ".cpp" else "#"
    return [m.group(0) for m in FORBIDDEN.finditer(code_only(path.read_text(), comment))]


def test_the_check_finds_a_gemm_call():
    """The source check below can fail: it finds the calls stage 04 makes."""
    stage_04 = STAGE.parent / "04_cpp_aten" / "FunctionCpp.cpp"
    if stage_04.exists():
        assert {"mm(", "addmm("} <= {call.replace(" ", "") for call in forbidden_calls(stage_04)}
    assert FORBIDDEN.search(code_only("y = at::matmul(x, w); // at::mm( is fine in a comment", "//"))
    assert FORBIDDEN.search(code_only("y = x @ w.t()", "#"))
    assert not FORBIDDEN.search(code_only('// at::mm(x, w)\nTORCH_CHECK(ok, "mm(");', "//"))
    assert not FORBIDDEN.search(code_only('    @staticmethod\n    def f(x):  # x.mm(w)\n        """x.mm(w)"""', "#"))


def test_no_aten_matrix_product_in_the_source():
    sources = [STAGE / "FunctionCpp.cpp", *sorted((STAGE / "eml").rglob("*.py"))]
    assert sources[0].exists(), f"the C++ source is missing: {sources[0]}"
    for path in sources:
        assert not forbidden_calls(path), f"{path.relative_to(STAGE)} calls a matrix product: {forbidden_calls(path)}"
