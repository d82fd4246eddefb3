"""Stage 12's tests, in two halves.

Without a GPU (this tutorial's own machines: torch's CPU build) the stage is not installed, and
the tests that run the kernels skip with the reason. What can be checked without a GPU still
runs: the CUDA and C++ sources are read for the defects the seed texts are known for (a launch
on the default stream, no launch check, a bounds guard missing on one dimension, float-only
maths such as fmaxf on doubles, raw pointers instead of packed accessors), each check is shown
to fail on a broken snippet, the kernel file itself runs on the CPU (compiled as C++, the grid
emulated thread by thread) against autograd, the Python package imports from its source folder and raises a
clear "needs CUDA" error only when the cell runs, its interface is stage 09's, and setup.py and
benchmark.py stop with one line.

With a GPU (a CUDA build of torch and this stage installed): the recurrent-cell contract of
common/ on CUDA tensors in float32 and float64, state sizes that are not multiples of the
32-wide block, gradcheck in float64, both build routes (setup.py and JIT), a launch on a
non-default stream and inside a CUDA graph capture (which fails for any launch that is not on
the current stream), and every input error.
"""

import importlib
import importlib.util
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from eml.common.cpp_checks import code_only
from eml.common.lltm_checks import (ARGUMENTS, DTYPES, NAMES, TOLERANCES, CellTests, Shape, assert_all_close,
                                    make_arguments, outputs_and_grads, reference_lltm)

STAGE = pathlib.Path(__file__).resolve().parents[1]
SRC = STAGE / "src"
KERNEL = SRC / "lltm_cuda_kernel.cu"
HOST = SRC / "lltm_cuda.cpp"

HAS_GPU = torch.version.cuda is not None and torch.cuda.is_available()
NO_GPU = (f"needs a GPU and a CUDA build of torch; this is torch {torch.__version__} "
          f"(torch.version.cuda={torch.version.cuda}, cuda available={torch.cuda.is_available()})")


def source_package():
    """The package as it is in src/, imported under a name that cannot shadow an installed
    eml.lltm_cuda; its compiled _C is absent there, which is the point."""
    name = "lltm_cuda_source"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SRC / "__init__.py", submodule_search_locations=[str(SRC)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def installed_package():
    """eml.lltm_cuda as installed by setup.py, or None (a CPU machine never installs it)."""
    try:
        return importlib.import_module("eml.lltm_cuda")
    except ImportError:
        return None


# ---- 1. The sources, read without compiling them ----

def kernels(code):
    """{name: body} of every __global__ function in code (comments and strings removed)."""
    found = {}
    for match in re.finditer(r"__global__\s+void\s+(\w+)\s*\(", code):
        start = code.index("{", match.end())
        depth, end = 0, start
        for end in range(start, len(code)):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            if depth == 0:
                break
        found[match.group(1)] = code[match.end():end + 1]  # parameters and body
    return found


def launches(code):
    """(launch configuration, arguments, the code right after the statement) of each <<<...>>>."""
    found = []
    for match in re.finditer(r"<<<(.*?)>>>\s*\(", code, flags=re.S):
        depth, end = 1, match.end()
        while depth and end < len(code):
            depth += {"(": 1, ")": -1}.get(code[end], 0)
            end += 1
        arguments = code[match.end():end - 1]
        rest = code[end:].lstrip()
        found.append(([part.strip() for part in match.group(1).split(",")], arguments, rest[1:].lstrip() if rest.startswith(";") else rest))
    return found


def kernel_defects(text):
    """The defects of a .cu source the seed texts are known for; [] for a clean one."""
    code = code_only(text, "//")
    defects = []
    if "AT_DISPATCH_FLOATING_TYPES" not in code:
        defects.append("no AT_DISPATCH_FLOATING_TYPES: the kernels do not run in float64")
    for function in re.findall(r"\b(fmaxf|fminf|expf|expm1f|tanhf|__expf|__tanhf|logf)\s*\(", code):
        defects.append(f"{function}() is float-only: it rounds a double to float")
    if re.search(r"\bdata_ptr\b|\.data<|packed_accessor64|\.accessor<", code):
        defects.append("raw pointers or non-packed accessors: use packed_accessor32")
    streams = set(re.findall(r"(\w+)\s*=\s*at::cuda::getCurrentCUDAStream\(\s*\)", code))
    found = launches(code)
    if not found:
        defects.append("no kernel launch found")
    for configuration, arguments, after in found:
        if len(configuration) < 4 or configuration[3] not in streams and "getCurrentCUDAStream" not in configuration[3]:
            defects.append(f"launch <<<{', '.join(configuration)}>>> is not on at::cuda::getCurrentCUDAStream()")
        if not after.startswith("C10_CUDA_KERNEL_LAUNCH_CHECK()"):
            defects.append(f"launch <<<{', '.join(configuration)}>>> is not followed by C10_CUDA_KERNEL_LAUNCH_CHECK()")
        parts = [part for part in re.split(r",\s*(?![^<]*>)", arguments) if part.strip()]
        if sum("packed_accessor32<" in part for part in parts) != len(parts):
            defects.append(f"launch <<<{', '.join(configuration)}>>> passes something other than packed_accessor32")
    for name, body in kernels(code).items():
        sizes = dict(re.findall(r"(\w+)\s*=\s*\w+\.size\((\d)\)", body))  # name -> dimension
        rows = [n for n, d in sizes.items() if d == "0"]
        columns = [n for n, d in sizes.items() if d != "0"]
        row = re.search(r"(\w+)\s*=\s*blockIdx\.y\b", body)
        column = re.search(r"(\w+)\s*=\s*blockIdx\.x\b", body)
        if not row or not any(re.search(rf"\b{row.group(1)}\s*<\s*{n}\b", body) for n in rows):
            defects.append(f"{name}: no bounds guard on the batch dimension (row < size(0))")
        if not column or not any(re.search(rf"\b{column.group(1)}\s*<\s*{n}\b", body) for n in columns):
            defects.append(f"{name}: no bounds guard on the state dimension (column < size(last))")
    return defects


def host_defects(text):
    """The defects of the host .cpp: asserts instead of TORCH_CHECK, unchecked device or dtype."""
    code = code_only(text, "//")
    defects = []
    if re.search(r"\bassert\s*\(", code):
        defects.append("assert() vanishes under -DNDEBUG: use TORCH_CHECK")
    for needed, what in [("is_cuda()", "the device is CUDA"), (".device() ==", "one device"),
                         ("scalar_type()", "the dtype"), ("sizes()", "the shapes"),
                         ("CUDAGuard", "a device guard")]:
        if needed not in code:
            defects.append(f"no check of {what} ({needed})")
    if not re.search(r"\baddmm\s*\(", code) or not re.search(r"\.mm\s*\(", code):
        defects.append("the GEMMs are not on ATen (addmm / mm)")
    return defects


def test_kernel_source_has_none_of_the_known_defects():
    assert kernel_defects(KERNEL.read_text()) == []


def test_host_source_checks_its_inputs_and_uses_cublas():
    assert host_defects(HOST.read_text()) == []


def test_two_kernels_each_launched_once():
    code = code_only(KERNEL.read_text(), "//")
    assert sorted(kernels(code)) == ["lltm_cuda_backward_kernel", "lltm_cuda_forward_kernel"]
    assert len(launches(code)) == 2


GOOD_KERNEL = """
template <typename scalar_t>
__global__ void k(const Accessor<scalar_t, 2> a, Accessor<scalar_t, 2> b) {
  const int batch_size = a.size(0);
  const int state_size = a.size(1);
  const int column = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row < batch_size && column < state_size) b[row][column] = a[row][column];
}
void f(at::Tensor a, at::Tensor b) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "f", ([&] {
    k<scalar_t><<<grid, block, 0, stream>>>(
        a.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
        b.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }));
}
"""

BROKEN_KERNELS = {
    "default stream": ("<<<grid, block, 0, stream>>>", "<<<grid, block>>>"),
    "no launch check": ("C10_CUDA_KERNEL_LAUNCH_CHECK();", ""),
    "no row guard": ("row < batch_size && ", ""),
    "no column guard": (" && column < state_size", ""),
    "column against the batch": ("column < state_size", "column < batch_size"),
    "fmaxf": ("b[row][column] = a[row][column]", "b[row][column] = fmaxf(a[row][column], 0)"),
    "raw pointer": ("b.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>()", "b.data_ptr<scalar_t>()"),
    "float only": ("AT_DISPATCH_FLOATING_TYPES", "AT_DISPATCH_SWITCH"),
}


def test_the_snippet_the_broken_ones_come_from_is_clean():
    assert kernel_defects(GOOD_KERNEL) == []


@pytest.mark.parametrize("defect", sorted(BROKEN_KERNELS))
def test_kernel_check_finds_each_defect(defect):
    old, new = BROKEN_KERNELS[defect]
    assert old in GOOD_KERNEL
    assert kernel_defects(GOOD_KERNEL.replace(old, new)) != []


def test_kernel_check_ignores_comments():
    commented = GOOD_KERNEL + "\n// fmaxf(x, y) would truncate doubles; <<<grid, block>>> is the default stream\n"
    assert kernel_defects(commented) == []


@pytest.mark.parametrize("old, new", [("TORCH_CHECK(", "assert("), ("is_cuda()", "is_cpu()"), ("at::addmm(", "at::matmul(")])
def test_host_check_finds_each_defect(old, new):
    text = HOST.read_text()
    assert old in text
    assert host_defects(text.replace(old, new, 1)) != []


# ---- 1b. The kernel file itself, run on the CPU ----
# Without a GPU the kernels can still run: the .cu file is compiled as plain C++ with a small
# shim (the CUDA keywords become nothing, blockIdx / threadIdx are variables, and each
# `kernel<<<grid, block, 0, stream>>>(...)` becomes a loop over every block and thread of the
# grid, one thread after the other: valid for kernels without shared memory or barriers).
# What runs is this stage's own source: its maths, its indexing, its guards, its grid shape.

EMULATION_SHIM = r"""
#include <cmath>
#define __global__
#define __device__
#define __forceinline__ inline
using std::exp;
using std::expm1;
using std::tanh;
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct uint3 { unsigned x, y, z; };
static uint3 blockIdx, threadIdx;
static dim3 blockDim, gridDim;
typedef void* cudaStream_t;
namespace at {  // ATen defines it only for nvcc (__CUDACC__)
template <typename T>
struct RestrictPtrTraits { typedef T* __restrict__ PtrType; };
}  // namespace at
static cudaStream_t emulated_current_stream() { return nullptr; }
static int emulated_launches = 0;
#define C10_CUDA_KERNEL_LAUNCH_CHECK() (void)0
template <typename Kernel, typename... Args>
void emulate_launch(dim3 grid, dim3 block, cudaStream_t, Kernel kernel, Args... args) {
  ++emulated_launches;
  gridDim = grid;
  blockDim = block;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx)
      for (unsigned ty = 0; ty < block.y; ++ty)
        for (unsigned tx = 0; tx < block.x; ++tx) {
          blockIdx = {bx, by, 0};
          threadIdx = {tx, ty, 0};
          kernel(args...);
        }
}
"""

EMULATION_BINDING = r"""
int launches() { return emulated_launches; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward_elementwise", &lltm_cuda_forward_elementwise);
  m.def("backward_elementwise", &lltm_cuda_backward_elementwise);
  m.def("launches", &launches);
}
"""


def emulated_source(text):
    """The .cu file as plain C++ for the CPU emulation (see EMULATION_SHIM)."""
    text = re.sub(r"#include <(c10/cuda/[^>]+|cuda\.h|cuda_runtime\.h)>.*\n", "", text)
    text = text.replace("at::cuda::getCurrentCUDAStream()", "emulated_current_stream()")
    text, launches_rewritten = re.subn(r"(\w+<scalar_t>)<<<\s*([^,]+?),\s*([^,]+?),\s*[^,]+?,\s*([^>]+?)>>>\(",
                                       r"emulate_launch(\2, \3, \4, \1, ", text)
    assert launches_rewritten == 2, f"expected two launches to rewrite, found {launches_rewritten}"
    return EMULATION_SHIM + text + EMULATION_BINDING


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """The kernel file compiled for the CPU (about a minute: one translation unit with torch)."""
    from torch.utils.cpp_extension import load_inline

    build = tmp_path_factory.mktemp("lltm_cuda_emulated")
    return load_inline(name="lltm_cuda_emulated", cpp_sources=[emulated_source(KERNEL.read_text())],
                       extra_cflags=["-O2"], build_directory=str(build))


def reference_elementwise(gate_weights, old_cell, grad_h, grad_cell):
    """Forward outputs and (d_old_cell, d_gates) of the element-wise part, by autograd."""
    state = old_cell.shape[1]
    gates = gate_weights.detach().requires_grad_()
    cell = old_cell.detach().requires_grad_()
    input_gate = torch.sigmoid(gates[:, :state])
    output_gate = torch.sigmoid(gates[:, state:2 * state])
    candidate = torch.nn.functional.elu(gates[:, 2 * state:])
    new_cell = cell + candidate * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    d_gates, d_old_cell = torch.autograd.grad([new_h, new_cell], [gates, cell], [grad_h, grad_cell])
    outputs = [t.detach() for t in (new_h, new_cell, input_gate, output_gate, candidate)]
    return outputs, [d_old_cell, d_gates]


# (batch, state): around the 32 x 8 block, an empty batch and state, and more rows than one
# grid holds (65535 blocks of 8 rows), so that threads loop over rows.
EMULATED_SHAPES = [(1, 1), (7, 33), (9, 31), (8, 32), (16, 128), (3, 257), (0, 5), (4, 0), (524_289, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_kernels_run_on_the_cpu_against_autograd(emulated, dtype):
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-14)
    for batch, state in EMULATED_SHAPES:
        if batch > 100_000 and dtype == torch.float32:
            continue  # the row loop once is enough (float64)
        generator = torch.Generator().manual_seed(batch * 1000 + state)
        gate_weights, old_cell, grad_h, grad_cell = (
            torch.randn(batch, n, generator=generator, dtype=dtype) * 2 for n in (3 * state, state, state, state))
        expected, expected_grads = reference_elementwise(gate_weights, old_cell, grad_h, grad_cell)
        launches = emulated.launches()
        outputs = emulated.forward_elementwise(gate_weights, old_cell)
        new_h, new_cell, input_gate, output_gate, candidate = outputs
        grads = emulated.backward_elementwise(grad_h, grad_cell, new_cell, input_gate, output_gate, candidate)
        assert emulated.launches() - launches == (2 if batch and state else 0), "one launch each way"
        names = ["new_h", "new_cell", "input_gate", "output_gate", "candidate_cell", "d_old_cell", "d_gates"]
        for name, actual, wanted in zip(names, outputs + grads, expected + expected_grads):
            torch.testing.assert_close(actual, wanted, **tolerance, msg=lambda m: f"B{batch} S{state} {name}: {m}")


def test_a_guard_made_always_true_is_flagged():
    # The seed texts' defect, applied to this file: `if (true)` in place of `column < state_size`.
    # (Compiled and run, the spare threads of the last block would write into the next row.)
    broken = KERNEL.read_text().replace("if (column < state_size) {", "if (true) {")
    assert broken != KERNEL.read_text()
    assert kernel_defects(broken) != []


# ---- 2. The Python package without the compiled module ----

def test_package_imports_from_source_without_the_extension():
    package = source_package()
    cell = package.LLTM(5, 7)
    assert cell.weights.shape == (21, 12) and cell.bias.shape == (21,)
    bound = 1 / 7 ** 0.5
    assert all(p.abs().max() <= bound for p in cell.parameters())
    # The tour's CPU benchmark times every "cells" entry on the CPU: this stage must not be one.
    assert "cells" not in package.TOUR and list(package.TOUR["cuda_cells"].values()) == [package.LLTM]


@pytest.mark.skipif(HAS_GPU, reason="a GPU is here: the source package's error is for CPU machines")
def test_running_the_cell_without_cuda_says_it_needs_cuda():
    package = source_package()
    cell = package.LLTM(5, 7)
    state = (torch.zeros(2, 7), torch.zeros(2, 7))
    with pytest.raises(RuntimeError, match=r"eml\.lltm_cuda needs CUDA: torch .* (CPU-only build|sees no GPU)"):
        cell(torch.zeros(2, 5), state)
    with pytest.raises(RuntimeError, match="needs CUDA"):
        package.LLTMFunction.apply(torch.zeros(2, 5), cell.weights, cell.bias, *state)


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch: jit.build() would compile")
def test_jit_route_without_cuda_says_it_needs_cuda():
    source_package()
    jit = importlib.import_module("lltm_cuda_source.jit")
    with pytest.raises(RuntimeError, match=r"needs CUDA: torch .* is a CPU-only build"):
        jit.build()


def signatures(package):
    return {
        "LLTM.__init__": inspect.signature(package.LLTM.__init__),
        "LLTM.forward": inspect.signature(package.LLTM.forward),
        "LLTMFunction.forward": inspect.signature(package.LLTMFunction.forward),
        "LLTMFunction.backward": inspect.signature(package.LLTMFunction.backward),
    }


def test_interface_is_stage_09s():
    python = pytest.importorskip("eml.lltm_python", reason="stage 09 (eml.lltm_python) is not installed")
    ours, theirs = signatures(source_package()), signatures(python)
    for name in ours:
        assert ours[name] == theirs[name], f"{name}: stage 12 {ours[name]} != stage 09 {theirs[name]}"
    cell, reference = source_package().LLTM(5, 7), python.LLTM(5, 7)
    assert {n: p.shape for n, p in cell.named_parameters()} == {n: p.shape for n, p in reference.named_parameters()}


# ---- 3. setup.py and benchmark.py where there is no CUDA ----

@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch: setup.py would build")
def test_setup_py_stops_with_one_line_without_cuda():
    result = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=STAGE, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert re.match(r"12_lltm_cuda: cannot build stage 12 \(CUDA kernels\): torch \S+ is a CPU-only build", lines[0])


@pytest.mark.skipif(HAS_GPU, reason="a GPU is here: benchmark.py would run")
def test_benchmark_stops_with_one_line_without_a_gpu():
    result = subprocess.run([sys.executable, str(STAGE / "benchmark.py")], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 1
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("benchmark.py: needs a GPU"), lines


# ---- 4. On a GPU: the recurrent-cell contract of common/, on CUDA tensors ----

PACKAGE = installed_package() or source_package()
BUILT = getattr(PACKAGE.lltm, "_C", None) is not None
needs_kernels = pytest.mark.skipif(
    not HAS_GPU or not BUILT,
    reason=NO_GPU if not HAS_GPU else "eml.lltm_cuda is not installed: pip install --no-build-isolation ./12_lltm_cuda",
)


@needs_kernels
class TestCell(CellTests):
    """Outputs and all five gradients against the reference in float32 and float64 on the
    contract's shapes (S = 1, 13, 31, 33, 127, 257: few are multiples of the 32-wide block),
    gradcheck, only the requested gradients, non-contiguous inputs, bad inputs, a short training run."""

    make_cell = staticmethod(PACKAGE.LLTM)
    function = staticmethod(PACKAGE.LLTMFunction.apply)
    prefix = "lltm_cuda"
    device = "cuda"


# Beyond the contract's shapes: a long state (1000 = 31 blocks + 8), S = 65 with a batch of 17
# (neither a multiple of 8), an empty state (nothing to launch), and more rows than one grid holds.
EXTRA_SHAPES = [Shape(13, 100, 1000), Shape(17, 9, 65), Shape(4, 6, 0)]


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", EXTRA_SHAPES, ids=str)
def test_more_state_sizes_against_the_reference(shape, dtype):
    arguments = make_arguments(shape, dtype, "cuda")
    assert_all_close(outputs_and_grads(PACKAGE.LLTMFunction.apply, arguments),
                     outputs_and_grads(reference_lltm, arguments), dtype)


@needs_kernels
def test_more_rows_than_one_grid_can_hold():
    # 600001 rows: more than 65535 blocks of 8 rows, so threads loop over several rows each.
    # float64: the weight gradient sums 600001 products, too many for a float32 tolerance.
    arguments = make_arguments(Shape(600_001, 2, 3), torch.float64, "cuda")
    assert_all_close(outputs_and_grads(PACKAGE.LLTMFunction.apply, arguments),
                     outputs_and_grads(reference_lltm, arguments), torch.float64)


# ---- 5. On a GPU: streams, graph capture, both build routes ----

@needs_kernels
def test_a_non_default_stream_gives_the_same_result():
    arguments = make_arguments(Shape(9, 13, 33), torch.float32, "cuda")
    expected = outputs_and_grads(PACKAGE.LLTMFunction.apply, arguments)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000)  # keep the side stream busy: work put on another stream would race ahead
        actual = outputs_and_grads(PACKAGE.LLTMFunction.apply, arguments)
    torch.cuda.current_stream().wait_stream(stream)
    for name, a, b in zip(NAMES, actual, expected):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")


@needs_kernels
def test_launches_go_to_the_current_stream_under_graph_capture():
    # During a CUDA graph capture, a launch on the legacy default stream fails the capture:
    # the forward and the backward capture and replay only if every launch is on the current stream.
    static = [a.requires_grad_() for a in make_arguments(Shape(9, 13, 33), torch.float32, "cuda")]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as the CUDA graphs documentation asks
        for _ in range(2):
            outputs_and_grads(PACKAGE.LLTMFunction.apply, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        new_h, new_cell = PACKAGE.LLTMFunction.apply(*static)
        grads = torch.autograd.grad(new_h.sum() + new_cell.sum(), static)
    graph.replay()
    torch.cuda.synchronize()
    h, c = reference_lltm(*static)
    torch.testing.assert_close(new_h, h.detach(), **TOLERANCES[torch.float32])
    torch.testing.assert_close(new_cell, c.detach(), **TOLERANCES[torch.float32])
    reference_grads = torch.autograd.grad(h.sum() + c.sum(), static)
    for name, a, b in zip(NAMES[2:], grads, reference_grads):
        torch.testing.assert_close(a, b, **TOLERANCES[torch.float32], msg=lambda m: f"{name}: {m}")


@needs_kernels
def test_setup_py_route_is_a_compiled_module_in_the_package():
    compiled = PACKAGE.lltm._C
    assert compiled.__file__.endswith(".so") and compiled.__name__ == "eml.lltm_cuda._C"


@needs_kernels
def test_jit_route_builds_the_same_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    module = importlib.import_module(PACKAGE.__name__ + ".jit").build()
    assert str(tmp_path) in module.__file__
    arguments = make_arguments(Shape(7, 13, 33), torch.float64, "cuda")
    for jit, installed in zip(module.forward(*arguments), PACKAGE.lltm._C.forward(*arguments)):
        torch.testing.assert_close(jit, installed, rtol=0, atol=0)
    grads = [torch.randn(7, 33, dtype=torch.float64, device="cuda") for _ in range(2)]
    saved = list(PACKAGE.lltm._C.forward(*arguments))[1:] + [arguments[1]]
    for jit, installed in zip(module.backward(*grads, *saved), PACKAGE.lltm._C.backward(*grads, *saved)):
        torch.testing.assert_close(jit, installed, rtol=0, atol=0)


# ---- 6. On a GPU: the input errors only a GPU stage has (the contract checks the others) ----

CUDA_BAD_INPUTS = {
    "input on the CPU": (dict(input=lambda t: t.cpu()), r"lltm_cuda: input must be a CUDA tensor, got device cpu"),
    "weights on the CPU": (dict(weights=lambda t: t.cpu()), r"lltm_cuda: weights must be a CUDA tensor, got device cpu"),
    "float16": ({name: (lambda t: t.half()) for name in ARGUMENTS},
                r"lltm_cuda: input must be float32 or float64, got Half"),
}


def bad_arguments(**changes):
    arguments = dict(zip(ARGUMENTS, make_arguments(Shape(3, 5, 7), torch.float32, "cuda")))
    for name, change in changes.items():
        arguments[name] = change(arguments[name])
    return list(arguments.values())


@needs_kernels
@pytest.mark.parametrize("case", sorted(CUDA_BAD_INPUTS))
def test_cuda_bad_input_is_a_clear_error(case):
    changes, pattern = CUDA_BAD_INPUTS[case]
    with pytest.raises(RuntimeError, match=pattern):
        PACKAGE.LLTMFunction.apply(*bad_arguments(**changes))


@needs_kernels
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_two_gpus_are_a_clear_error():
    with pytest.raises(RuntimeError, match=r"lltm_cuda: old_h is on cuda:1 but input is on cuda:0"):
        PACKAGE.LLTMFunction.apply(*bad_arguments(old_h=lambda t: t.to("cuda:1")))
