"""Checks of a C++ stage's compiled module, called directly (without autograd).

Every C++ stage (04, 05, 06, ...) exposes the same two entry points, whatever else it takes:

    forward(input, weight, bias_or_None)                                   -> output
    backward(grad_output, input_or_None, weight_or_None,
             need_grad_input, need_grad_weight, need_grad_bias)            -> [gx, gw, gb]

A stage's test file adapts its module to them and inherits the tests:

    class TestModule(CppModuleTests):
        prefix = "linear_cpp"                      # every C++ error message starts with it
        module = _C
        def forward(self, input, weight, bias):
            return _C.forward(input, weight, bias)
        def backward(self, grad_output, input, weight, *needs):
            return _C.backward(grad_output, input, weight, *needs)

It also tests the course's two functions, ``module.forward(input, weight)`` and
``module.backward(grad_output, input, weights)``, on the whole shape set.
"""

from __future__ import annotations

import math
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest
import torch

from eml.common.checks import CASES, Case, assert_close, expect_error, make_input

# No input features (y = b, empty grad_input) or no output features (empty y, zero grad_input).
ZERO_FEATURES = [Case((4,), 0, 3), Case((4,), 3, 0)]

# Shapes that fit no vector width and no block: every C++ stage's products against torch.
AWKWARD = [
    Case((1823,), 31, 7),       # a tall batch, few features (1823 rows, as in Triton's "Fused Softmax" tutorial)
    Case((3,), 781, 129),       # wide rows: a row of W spans many cache lines; 129 = 2 * 64 + 1
    Case((5, 7, 3), 67, 257),   # three leading dimensions, odd sizes everywhere
    Case((131,), 257, 263),     # primes past any block in every dimension
    Case((1100,), 1030, 65),    # K > 1024: a reduction longer than one cache-sized step
    Case((0,), 9, 4),           # nothing to do: empty output, zero weight gradient
    Case((3,), 0, 5),           # no input features: y = b, empty grad_input
    Case((5,), 3, 0),           # no output features: empty output, zero grad_input
    Case((), 1, 300),           # 1-D input, one input feature
]

NAMES = ["output", "grad_input", "grad_weight", "grad_bias"]

# (need_grad_input, need_grad_weight, need_grad_bias)
NEEDS = [(True, False, False), (False, True, False), (False, False, True), (True, True, True), (False, True, True)]


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


def everything(module, input, weight, bias, grad_output, *extra):
    """output and the three gradients straight from a compiled module; ``extra`` are the stage's
    own trailing arguments of forward and backward (05: a loop order, 06: a LinearState)."""
    return [module.forward(input, weight, bias, *extra), *module.backward(grad_output, input, weight, True, True, True, *extra)]


def assert_results_close(got, want, case, dtype, what=""):
    """[output, grad_input, grad_weight, grad_bias] against ``want``, shapes included. common/'s
    tolerance, with float32's absolute part grown like sqrt(terms summed): in_features terms per
    output element, out_features per grad_input element, N per grad_weight and grad_bias one."""
    n = math.prod(case.leading)
    for name, g, w, terms in zip(NAMES, got, want, [case.in_features, case.out_features, n, n]):
        assert g.shape == w.shape, f"{name} {what}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        if dtype == torch.float64:
            assert_close(g, w, dtype, f"{name} {case} {what}")
        else:
            atol = 2e-5 * math.sqrt(max(1, terms))
            torch.testing.assert_close(g, w, rtol=2e-5, atol=atol, msg=lambda m: f"{name} {case} {what}: {m}")


def assert_matches_torch_in_turns_and_on_two_threads(module, extra=lambda case: (), rounds=10):
    """Stages 06-08 and 16 pack some operands for one call alone (W^T for grad_input, x^T for
    grad_weight, and W in a forward that does not cache it) into a scratch buffer per calling
    thread that only grows (06's README: the training step). Two new threads, so two empty sets
    of buffers, start together behind a barrier and take turns with layers of different sizes:
    small, big, big in float64 (twice the bytes), small again, one thread in the opposite order of
    the other, ``rounds`` times each; every result against torch. A buffer that does not grow, or
    one shared by the threads while both run, gives a wrong result or a crash. (The threads run
    at once only where the call releases the GIL: the registered operators of 08 and 16; the
    pybind11 functions of 06 and 07 hold it, and there the check covers the growth only.)
    ``extra(case)``: the stage's own trailing arguments (06 and 07: a LinearState)."""
    big, small = Case((70,), 300, 200), Case((3,), 9, 5)
    turns = [(small, torch.float32), (big, torch.float32), (big, torch.float64), (small, torch.float64)]
    cases = {(case, dtype): tensors(case, dtype) for case in (big, small) for dtype in (torch.float32, torch.float64)}
    wants = {key: [torch.nn.functional.linear(x, w, b), *expected_grads(x, w, g)] for key, (x, w, b, g) in cases.items()}
    start = threading.Barrier(2)
    failures = []

    def take_turns(order):
        try:
            start.wait()
            for _ in range(rounds):
                for case, dtype in order:
                    input, weight, bias, grad_output = cases[(case, dtype)]
                    got = everything(module, input, weight, bias, grad_output, *extra(case))
                    assert_results_close(got, wants[(case, dtype)], case, dtype, "in turns, on two threads")
        except Exception as error:  # noqa: BLE001 - carried to the assert below
            failures.append(error)
            start.abort()

    threads = [threading.Thread(target=take_turns, args=(order,)) for order in (turns, turns[::-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, f"layers in turn on two threads: {failures[0]}"


class CppModuleTests:
    prefix = None               # e.g. "linear_cpp": C++ messages start with "linear_cpp: "
    module = None               # the module whose forward/backward are tested
    compiled = None             # the shared object checked for libgomp, if not module itself
    # True when each output element is summed by one thread in one fixed order, so that 1 and
    # 2 threads must agree bitwise, not only to float tolerance.
    bitwise_across_threads = False

    def forward(self, input, weight, bias):
        raise NotImplementedError

    def backward(self, grad_output, input, weight, need_input, need_weight, need_bias):
        raise NotImplementedError

    def apply(self, input, weight, bias):
        """Through the stage's autograd Function: returns the output, and the arguments that the
        module's backward must receive after its three need_grad flags (a loop order, a state)."""
        raise NotImplementedError

    @pytest.fixture
    def restore_threads(self):
        threads = torch.get_num_threads()
        yield
        torch.set_num_threads(threads)

    def everything(self, input, weight, bias, grad_output):
        return [self.forward(input, weight, bias), *self.backward(grad_output, input, weight, True, True, True)]

    # -- results against torch ----------------------------------------------------------
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
    @pytest.mark.parametrize("case", CASES + ZERO_FEATURES, ids=str)
    def test_all_results_match_torch(self, case, dtype):
        input, weight, bias, grad_output = tensors(case, dtype)
        reference = [torch.nn.functional.linear(input, weight, bias), *expected_grads(input, weight, grad_output)]
        for name, got, want in zip(["output", "grad_input", "grad_weight", "grad_bias"], self.everything(input, weight, bias, grad_output), reference):
            assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            assert_close(got, want, dtype, name)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
    @pytest.mark.parametrize("case", CASES + ZERO_FEATURES, ids=str)
    def test_course_functions_called_directly(self, case, dtype):
        input, weight, _, grad_output = tensors(case, dtype)
        assert_close(self.module.forward(input, weight), torch.nn.functional.linear(input, weight), dtype, "forward(input, weight)")
        grads = self.module.backward(grad_output, input, weight)
        assert isinstance(grads, list) and len(grads) == 2, "backward returns [grad_input, grad_weight]"
        for name, grad, want in zip(["grad_input", "grad_weight"], grads, expected_grads(input, weight, grad_output)):
            assert grad.shape == want.shape, name
            assert_close(grad, want, dtype, name)

    def test_non_contiguous_tensors(self):
        input = torch.randn(9, 6, dtype=torch.float64).t()  # (6, 9), strides (1, 6)
        weight = torch.randn(9, 4, dtype=torch.float64).t()  # (4, 9)
        grad_output = torch.randn(4, 6, dtype=torch.float64).t()  # (6, 4)
        bias = torch.randn(8, dtype=torch.float64)[::2]  # stride 2
        assert not (input.is_contiguous() or weight.is_contiguous() or grad_output.is_contiguous() or bias.is_contiguous())
        assert_close(self.forward(input, weight, bias), input @ weight.t() + bias, torch.float64, "forward")
        grads = self.backward(grad_output, input, weight, True, True, True)
        for name, grad, want in zip(["grad_input", "grad_weight", "grad_bias"], grads, expected_grads(input, weight, grad_output)):
            assert_close(grad, want, torch.float64, name)

    # -- needs_input_grad: only the gradients asked for, only the tensors they need ------
    @pytest.mark.parametrize("needs", NEEDS, ids=lambda n: "".join("xwb"[i] for i in range(3) if n[i]))
    def test_backward_computes_only_what_is_asked(self, needs):
        input, weight, _, grad_output = tensors(CASES[7])
        need_input, need_weight, _ = needs
        # As Function.backward passes them: the input only when grad_weight needs it, and so on.
        grads = self.backward(grad_output, input if need_weight else None, weight if need_input else None, *needs)
        for need, grad, want in zip(needs, grads, expected_grads(input, weight, grad_output)):
            if need:
                assert_close(grad, want, torch.float64, f"gradient for needs={needs}")
            else:
                assert grad is None, f"computed a gradient nobody asked for: needs={needs}"

    @pytest.mark.parametrize("requires", [(True, False, False), (False, True, False), (False, False, True), (True, True, True)])
    def test_function_passes_needs_input_grad_to_cpp(self, requires, monkeypatch):
        """Through autograd: C++ is told exactly which gradients are wanted, gets no extra tensor,
        and gets the stage's own arguments (loop order, state)."""
        calls = []
        real_backward = self.module.backward

        def spy(grad_output, input, weight, *needs_and_extra):
            calls.append((input is not None, weight is not None, needs_and_extra))
            return real_backward(grad_output, input, weight, *needs_and_extra)

        monkeypatch.setattr(self.module, "backward", spy)
        input, weight, bias, _ = tensors(CASES[7])
        for tensor, flag in zip([input, weight, bias], requires):
            tensor.requires_grad_(flag)
        output, extra = self.apply(input, weight, bias)
        output.sum().backward()
        need_input, need_weight, _ = requires
        # The input only when grad_weight needs it, the weight only when grad_input does.
        assert calls == [(need_weight, need_input, (*requires, *extra))]

    def test_backward_refuses_a_missing_tensor_it_needs(self):
        input, weight, _, grad_output = tensors(CASES[7])
        start = rf"^{self.prefix}:"
        expect_error(lambda: self.backward(grad_output, None, weight, False, True, False), start, r"grad_weight", r"input", r"None")
        expect_error(lambda: self.backward(grad_output, input, None, True, False, False), start, r"grad_input", r"weight", r"None")

    # -- check_inputs: every message opens with the stage's name and names the value -----
    def test_messages_name_the_stage_and_the_values(self):
        x, w, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(3)
        start = rf"^{self.prefix}: "
        expect_error(lambda: self.forward(x[..., :5], w, None), start, r"features", r"\b5\b", r"\b6\b")
        expect_error(lambda: self.forward(torch.tensor(1.0), w, None), start, r"0-d")
        expect_error(lambda: self.forward(x.long(), w, None), start, r"dtype", r"Long")
        expect_error(lambda: self.forward(x, w.double(), None), start, r"dtype", r"Double", r"Float")
        expect_error(lambda: self.forward(x, w, b.double()), start, r"bias", r"dtype", r"Double", r"Float")
        expect_error(lambda: self.forward(x.to("meta"), w, None), start, r"device", r"meta")
        expect_error(lambda: self.forward(x, w.to("meta"), None), start, r"weight", r"device", r"meta")
        expect_error(lambda: self.forward(x, w, torch.randn(1, 3)), start, r"bias", r"shape \[3\]", r"\[1, 3\]")
        expect_error(lambda: self.forward(x, w.reshape(3, 2, 3), None), start, r"weight", r"got 3 dim")

    def test_backward_checks_grad_output(self):
        x, w = torch.randn(4, 6), torch.randn(3, 6)
        start = rf"^{self.prefix}: "
        expect_error(lambda: self.backward(torch.randn(4, 5), x, w, True, True, False), start, r"grad_output", r"\b3\b", r"\b5\b")
        expect_error(lambda: self.backward(torch.randn(2, 3), x, w, True, True, False), start, r"grad_output", r"\[4\]", r"\[2\]")
        expect_error(lambda: self.backward(torch.randn(4, 3).double(), x, w, True, True, False), start, r"grad_output", r"dtype", r"Double")

    # -- threads ----------------------------------------------------------------------------
    def test_same_result_on_one_and_two_threads(self, restore_threads):
        # Big enough to be split over threads, and no multiple of any block size.
        input, weight, bias, grad_output = tensors(Case((130,), 129, 257), torch.float32)
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(self.everything(input, weight, bias, grad_output))
        for name, one, two in zip(["output", "grad_input", "grad_weight", "grad_bias"], *results):
            if self.bitwise_across_threads:
                assert torch.equal(one, two), f"{name}: 2 threads differ from 1"
            else:
                assert_close(two, one, torch.float32, f"{name}, 2 threads against 1")

    @pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps is Linux's")
    def test_one_openmp_runtime_in_the_process(self, restore_threads):
        """The two-OpenMP trap: -fopenmp only at compile time, so the module uses torch's libgomp."""
        torch.set_num_threads(2)
        self.everything(*tensors(Case((130,), 129, 257), torch.float32))  # run a parallel region first
        with open("/proc/self/maps") as maps:
            runtimes = {line.split()[-1] for line in maps if re.search(r"lib(g|i)omp", line)}
        assert len(runtimes) <= 1, f"two OpenMP runtimes in one process: {sorted(runtimes)}"
        # The cause, not only the symptom: the module names no OpenMP library of its own.
        compiled = self.compiled or self.module
        assert pathlib.Path(compiled.__file__).suffix == ".so", f"{compiled.__file__} is not the compiled module"
        assert b"libgomp" not in pathlib.Path(compiled.__file__).read_bytes(), (
            f"{compiled.__name__} is linked against a libgomp: pass -fopenmp to the compiler only"
        )


# -- "no ATen matrix product here": the source check of stages that write their own GEMMs ---
# ATen's and BLAS's matrix products as a call, e.g. at::mm(, at::mm_out(, .matmul(,
# cblas_sgemm(, and Python's matrix-multiply operator x @ w (a decorator's @ starts its line, so
# it is not one). The source check sees only what is spelled out; assert_dispatches_no_matrix_product
# below judges what a call really runs.
FORBIDDEN = re.compile(
    r"\b(mm|matmul|addmm|_addmm_activation|addmv|mv|bmm|baddbmm|addbmm|linear|einsum|dot|vdot|inner|outer|"
    r"tensordot|chain_matmul|\w*gemm\w*)(_out)?\s*\(|[\w)\]][ \t]*@(?!=)"
)


def code_only(text, comment):
    """Source text without comments and string literals: prose may say 'dot product'."""
    if comment == "#":
        text = re.sub(r'"""(.|\n)*?"""', "", text)  # docstrings
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)  # string literals, one line each
    if comment == "//":
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # /* block */ and /*label=*/ comments
    return re.sub(rf"{re.escape(comment)}.*", "", text)


def matrix_product_calls(path):
    """The matrix-product calls in one .cpp or .py file, outside comments and strings."""
    path = pathlib.Path(path)
    comment = "//" if path.suffix in (".cpp", ".h", ".cu") else "#"
    return [m.group(0) for m in FORBIDDEN.finditer(code_only(path.read_text(), comment))]


def assert_no_matrix_product(stage_dir):
    """Every C++ and Python source of a stage (its src/ folder) is free of ATen/BLAS matrix products."""
    source_dir = pathlib.Path(stage_dir) / "src"
    sources = sorted(p for p in source_dir.rglob("*") if p.suffix in (".cpp", ".h", ".cu", ".py"))
    assert any(p.suffix == ".cpp" for p in sources), f"no C++ source found in {source_dir}"
    for path in sources:
        calls = matrix_product_calls(path)
        assert not calls, f"{path.relative_to(source_dir)} calls a matrix product: {calls}"


# -- "no ATen matrix product here", judged on what runs -------------------------------------
# Every ATen operator a call dispatches on the calling thread, from Python or from an extension's
# C++ (at::mm in a pybind11 module goes through the dispatcher too), seen at the dispatcher's
# Python key (the mode does not follow at::parallel_for onto its worker threads). A
# composite such as aten::linear shows as the products its kernel calls; a registered operator
# (torch.library) shows as one entry, its inside unseen: use it on pybind11 stages.
MATRIX_PRODUCT_OPS = {
    "mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "matmul", "mv", "addmv", "dot", "vdot",
    "linear", "einsum", "tensordot", "inner", "outer", "chain_matmul", "_mkldnn_matmul",
}


def dispatched_ops(run):
    """The names (aten::mm -> "mm") of the ATen operators run() dispatches, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode  # private: torch 2.x's hook for this

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func._schema.name.split("::")[-1])
            return func(*args, **(kwargs or {}))

    with Recorder() as recorder:
        run()
    return recorder.names


def assert_dispatches_no_matrix_product(run):
    """run() (a forward and a backward, say) dispatches no ATen matrix product."""
    names = dispatched_ops(run)
    assert names, "run() dispatched no operator at all: nothing was checked"
    products = sorted({name for name in names if name in MATRIX_PRODUCT_OPS})
    assert not products, f"an ATen matrix product ran: {products} (all operators: {names})"


# -- what a compiled module exports ------------------------------------------------------------
def exported_symbols(path):
    """The dynamic symbols a shared object defines, demangled (nm -D -C --defined-only)."""
    if shutil.which("nm") is None:
        pytest.skip("needs binutils' nm")
    result = subprocess.run(["nm", "-D", "-C", "--defined-only", str(path)], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def imported_symbols(path):
    """The dynamic symbols a shared object needs from other libraries, demangled (nm -D -C --undefined-only)."""
    if shutil.which("nm") is None:
        pytest.skip("needs binutils' nm")
    result = subprocess.run(["nm", "-D", "-C", "--undefined-only", str(path)], capture_output=True, text=True, check=True)
    return [line.split(maxsplit=1)[-1] for line in result.stdout.splitlines()]


def libtorch_cpp_imports(path):
    """The imported symbols that name libtorch's C++: at::, c10::, torch:: or caffe2:: anywhere in
    the demangled name (a function, or "typeinfo for c10::Error", or a template over c10 types)."""
    return [name for name in imported_symbols(path) if re.search(r"\b(at|c10|torch|caffe2)::", name)]


def assert_imports_no_libtorch_cpp_symbol(path):
    """LibTorch's stable ABI: the module calls libtorch through its C shim only. A C++ name from
    libtorch changes with any torch release, with no promise; one is enough for the module to
    fail to load under another torch ("undefined symbol"), or to load and disagree with it."""
    cpp = libtorch_cpp_imports(path)
    name = pathlib.Path(path).name
    assert not cpp, f"{name} imports {len(cpp)} libtorch C++ symbol(s), e.g. {cpp[:3]}"


def assert_exports_no_symbol_of(path, namespace):
    """-fvisibility=hidden: the module exports its init function, PyInit__C, and no symbol of its
    own C++ namespace, so that modules sharing the namespace can live in one process."""
    lines = exported_symbols(path)
    own = [line.split(maxsplit=2)[-1] for line in lines if f"{namespace}::" in line]
    name = pathlib.Path(path).name
    assert not own, f"{name} exports {len(own)} symbol(s) of namespace {namespace}: {own[:3]}"
    assert any(line.endswith(" PyInit__C") for line in lines), f"{name} does not export PyInit__C"
