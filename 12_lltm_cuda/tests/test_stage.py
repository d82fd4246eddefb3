"""Stage 12's tests, in two halves.

Without a GPU (with torch's CPU build, as `make` installs it) the stage is not installed, and
the tests that need a GPU skip with the reason. What runs without one: the kernel file itself,
compiled as C++ for the CPU with the grid emulated thread by thread, judged by what it does
(results against autograd on sizes that are not multiples of the block, canary bytes around
every buffer it allocates, NaN around every buffer it reads, each launch on the current stream
and checked), with a kernel broken each such way shown to fail; the host file compiled for the
CPU the same way, so that the whole stage (lltm.py, lltm_cuda.cpp, the kernels) runs through the
recurrent-cell contract of common/ and stage 11's interface checks (the gates returned and
saved alone, the GEMMs skipped that nobody asked for) and the host's own duties (device guards,
GEMMs on ATen, wrong device or dtype refused); the host source read for assert(); the Python package imported from its source folder, raising a clear "needs CUDA" error
only when the cell runs; and setup.py, benchmark.py and gpu_run.sh stopping with one line.

With a GPU (a CUDA build of torch and this stage installed): the same contract and interface
checks on CUDA tensors, state sizes that are not multiples of the 32-wide block, more rows than
one grid holds, both build routes (setup.py and JIT), a launch on a non-default stream and
inside a CUDA graph capture (which fails for any launch that is not on the current stream),
and the input errors only a GPU stage has.
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


# ---- 1. The host source, read for what a build flag hides: assert() under -DNDEBUG ----

def test_host_source_uses_torch_check_not_assert():
    """assert() vanishes under the -DNDEBUG of setuptools builds: a compile-time fact, so a read
    of the text. What the checks do is judged by behaviour: on the emulated host (section 1c) and
    on a GPU (section 6)."""
    assert not re.search(r"\bassert\s*\(", code_only(HOST.read_text(), "//"))


# ---- 1b. The kernel file itself, run on the CPU and judged by what it does ----
# Without a GPU the kernels can still run: the .cu file is compiled as plain C++ with a small
# shim (the CUDA keywords become nothing, blockIdx / threadIdx are variables, and each
# `kernel<<<grid, block, shared, stream>>>(...)` becomes a loop over every block and thread of
# the grid, one thread after the other: valid for kernels without shared memory or barriers).
# What runs is this stage's own source: its maths, its indexing, its guards, its grid shape, its
# launches. While a host function of the .cu file runs, every buffer it allocates comes from a
# canary allocator: 0xA5 bytes before and after it (a write out of bounds changes them), the
# buffer itself filled with 0xFF (NaN in float and double: an element no thread writes stays
# NaN). The inputs the tests pass lie inside NaN-filled buffers (a read out of bounds brings NaN
# into the results). The legacy default stream is the null stream, as in CUDA, and the current
# stream another one, as under `torch.cuda.stream(s)` or a graph capture. The same file with
# one defect each (BROKEN_KERNELS) is compiled beside it, to show that each judgement can fail.

EMULATION_SHIM = r"""
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/core/CPUAllocator.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

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
typedef const void* cudaStream_t;
namespace at {  // ATen defines it only for nvcc (__CUDACC__)
template <typename T>
struct RestrictPtrTraits { typedef T* __restrict__ PtrType; };
}  // namespace at
namespace c10::cuda {  // the emulated GPU is the CPU: there is no device to switch to, only count
static int64_t guards_made = 0;
struct OptionalCUDAGuard {
  explicit OptionalCUDAGuard(c10::Device) { ++guards_made; }
};
}  // namespace c10::cuda

// ---- Launches: on which stream, and checked before the next launch or the return ----
static const char current_stream_token = 0;
static cudaStream_t emulated_current_stream() { return &current_stream_token; }  // not the null stream

struct Report {
  int64_t launches = 0, off_current_stream = 0, unchecked_launches = 0, damaged_bytes = 0;
};
static Report report;
static bool launch_unchecked = false;
#define C10_CUDA_KERNEL_LAUNCH_CHECK() (launch_unchecked = false)

struct LaunchConfig {
  dim3 grid, block;
  size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;  // <<<grid, block>>>: the legacy default stream
};

template <typename Kernel, typename... Args>
void emulate_launch(LaunchConfig config, Kernel kernel, Args... args) {
  report.unchecked_launches += launch_unchecked;  // the previous launch was never checked
  report.launches += 1;
  report.off_current_stream += config.stream != emulated_current_stream();
  launch_unchecked = true;
  gridDim = config.grid;
  blockDim = config.block;
  for (unsigned by = 0; by < gridDim.y; ++by)
    for (unsigned bx = 0; bx < gridDim.x; ++bx)
      for (unsigned ty = 0; ty < blockDim.y; ++ty)
        for (unsigned tx = 0; tx < blockDim.x; ++tx) {
          blockIdx = {bx, by, 0};
          threadIdx = {tx, ty, 0};
          kernel(args...);
        }
}

// ---- Canary bytes around every buffer a host function allocates ----
constexpr unsigned char kCanary = 0xA5, kUnwritten = 0xFF;
struct Block { size_t margin, nbytes, total; int64_t call; };
static std::map<void*, Block> blocks;  // base address -> block, for the buffers still alive
static int64_t current_call = 0;

static int64_t damage(const unsigned char* base, const Block& block) {
  int64_t changed = 0;
  for (size_t i = 0; i < block.margin; ++i) changed += base[i] != kCanary;
  for (size_t i = block.margin + block.nbytes; i < block.total; ++i) changed += base[i] != kCanary;
  return changed;
}

static void free_block(void* base) {
  const auto found = blocks.find(base);
  if (found != blocks.end()) {
    if (found->second.call == current_call) report.damaged_bytes += damage(static_cast<unsigned char*>(base), found->second);
    blocks.erase(found);
  }
  std::free(base);
}

struct CanaryAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const size_t margin = (nbytes + 4096 + 63) / 64 * 64;  // the buffer's own size and a page, each side
    const size_t total = 2 * margin + (nbytes + 63) / 64 * 64;
    auto* base = static_cast<unsigned char*>(std::aligned_alloc(64, total));
    TORCH_CHECK(base != nullptr, "emulation: out of memory for ", total, " bytes");
    std::memset(base, kCanary, total);
    std::memset(base + margin, kUnwritten, nbytes);
    blocks[base] = {margin, nbytes, total, current_call};
    return {base + margin, base, &free_block, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};
static CanaryAllocator canary_allocator;

// Runs one host function of the .cu file with the canary allocator, then fills `report`.
template <typename Call>
std::vector<at::Tensor> run_checked(Call call) {
  report = Report{};
  launch_unchecked = false;
  ++current_call;
  c10::Allocator* previous = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&canary_allocator, /*priority=*/255);
  std::vector<at::Tensor> outputs;
  try {
    outputs = call();
  } catch (...) {
    c10::SetCPUAllocator(previous, /*priority=*/255);
    throw;
  }
  c10::SetCPUAllocator(previous, /*priority=*/255);
  report.unchecked_launches += launch_unchecked;  // the last launch, unchecked at the return
  for (const auto& [base, block] : blocks) {
    if (block.call == current_call) report.damaged_bytes += damage(static_cast<const unsigned char*>(base), block);
  }
  return outputs;
}

std::map<std::string, int64_t> last_report() {
  return {{"launches", report.launches}, {"off_current_stream", report.off_current_stream},
          {"unchecked_launches", report.unchecked_launches}, {"damaged_bytes", report.damaged_bytes}};
}
"""

# The kernel file with one defect each: (text in the file, what replaces it).
BROKEN_KERNELS = {
    "no column guard": [("if (column < state_size) {", "if (true) {")],
    "no row guard": [("row < batch_size;", "row < static_cast<int>(gridDim.y * blockDim.y);")],
    "default stream": [(", 0, stream>>>", ">>>")],
    "no launch check": [("C10_CUDA_KERNEL_LAUNCH_CHECK();", "")],
    "float-only expm1f": [("alpha * expm1(z)", "alpha * expm1f(z)")],
}
AS_WRITTEN = "as written"


def namespace(variant):
    return re.sub(r"\W", "_", variant)


def emulated_kernel_file(text, variant):
    """The .cu text as plain C++ in a namespace of its own (see EMULATION_SHIM)."""
    text = re.sub(r"^#include .*\n", "", text, flags=re.M)  # the shim includes what it needs
    text = text.replace("at::cuda::getCurrentCUDAStream()", "emulated_current_stream()")
    text, rewritten = re.subn(r"([\w:]+(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\(", r"emulate_launch(LaunchConfig{\2}, \1, ",
                              text, flags=re.S)
    assert rewritten == 2, f"expected two launches to rewrite, found {rewritten}"
    return f"namespace {namespace(variant)} {{\n{text}\n}}  // namespace {namespace(variant)}\n"


def emulated_host_file(text):
    """lltm_cuda.cpp for the CPU, beside the kernels as written: its CUDA-device checks ask for
    the CPU, and its pybind11 module becomes a function that fills the submodule `host`."""
    text = re.sub(r"^#include .*\n", "", text, flags=re.M)
    text, cuda_checks = re.subn(r"\.is_cuda\(\)", ".is_cpu()", text)
    text, modules = re.subn(r"PYBIND11_MODULE\(TORCH_EXTENSION_NAME, m\)", "void bind(pybind11::module_& m)", text)
    assert cuda_checks >= 1 and modules == 1, "lltm_cuda.cpp changed shape: update emulated_host_file"
    return f"namespace {namespace(AS_WRITTEN)} {{\n{text}\n}}  // namespace {namespace(AS_WRITTEN)}\n"


def emulated_source():
    """One C++ file: the shim, the kernel file as written and once per defect, the host file, the binding."""
    kernel = KERNEL.read_text()
    variants = {AS_WRITTEN: kernel}
    for variant, replacements in BROKEN_KERNELS.items():
        broken = kernel
        for old, new in replacements:
            assert old in broken, f"the broken kernel {variant!r} no longer applies: {old!r} is not in {KERNEL.name}"
            broken = broken.replace(old, new)
        variants[variant] = broken
    parts = [EMULATION_SHIM] + [emulated_kernel_file(text, variant) for variant, text in variants.items()]
    parts.append(emulated_host_file(HOST.read_text()))
    binding = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
               '  m.def("last_report", &last_report);',
               '  m.def("guards_made", [] { return c10::cuda::guards_made; });',
               '  auto host = m.def_submodule("host", "lltm_cuda.cpp compiled for the CPU");',
               f"  {namespace(AS_WRITTEN)}::bind(host);"]
    for variant in variants:
        space = namespace(variant)
        binding += [
            f'  m.def("forward_{space}", [](const at::Tensor& gates, const at::Tensor& old_cell) {{',
            f"    return run_checked([&] {{ return {space}::lltm_cuda_forward_elementwise(gates, old_cell); }});",
            "  });",
            f'  m.def("backward_{space}", [](const at::Tensor& grad_h, const at::Tensor& grad_cell,',
            "                                 const at::Tensor& new_cell, const at::Tensor& gates) {",
            f"    return run_checked([&] {{ return {space}::lltm_cuda_backward_elementwise(grad_h, grad_cell, new_cell, gates); }});",
            "  });",
        ]
    parts.append("\n".join(binding + ["}"]) + "\n")
    return "\n".join(parts)


def build_emulated(folder):
    """The kernel file (as written and broken five ways) and the host file compiled for the CPU
    into folder/lltm_cuda_emulated (one to three minutes: one translation unit with torch)."""
    from torch.utils.cpp_extension import load_inline

    build = pathlib.Path(folder, "lltm_cuda_emulated")
    build.mkdir(exist_ok=True)
    return load_inline(name="lltm_cuda_emulated", cpp_sources=[emulated_source()], extra_cflags=["-O2"],
                       build_directory=str(build))


def build_in_background(folder):
    """The emulated module's build, which the root conftest.py starts as the session begins, so
    that it compiles while other tests run (see there)."""
    build_emulated(folder)


@pytest.fixture(scope="module")
def emulated(background_builds):
    return build_emulated(background_builds)  # built by build_in_background above, or by this call


def inside_nan(tensor):
    """tensor's values in the middle of a NaN-filled buffer, as large again on each side: a kernel
    that reads past either end reads NaN, and NaN reaches its results."""
    n = tensor.numel()
    margin = n + 4096
    buffer = torch.full((2 * margin + n,), float("nan"), dtype=tensor.dtype)
    buffer[margin:margin + n] = tensor.reshape(-1)
    return buffer[margin:margin + n].view(tensor.shape)


def reference_elementwise(gates, old_cell, grad_h, grad_cell):
    """[new_h, new_cell] and [d_old_cell, d_gates] of the element-wise part, by autograd."""
    state = old_cell.shape[1]
    gates = gates.detach().requires_grad_()
    cell = old_cell.detach().requires_grad_()
    input_gate = torch.sigmoid(gates[:, :state])
    output_gate = torch.sigmoid(gates[:, state:2 * state])
    candidate = torch.nn.functional.elu(gates[:, 2 * state:])
    new_cell = cell + candidate * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    d_gates, d_old_cell = torch.autograd.grad([new_h, new_cell], [gates, cell], [grad_h, grad_cell])
    return [new_h.detach(), new_cell.detach()], [d_old_cell, d_gates]


def judge(emulated, variant, batch, state, dtype):
    """Both kernels of one variant of the file at one size: [] if they behave, else what went wrong."""
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-14)
    generator = torch.Generator().manual_seed(batch * 1000 + state)
    gates, old_cell, grad_h, grad_cell = (
        torch.randn(batch, n, generator=generator, dtype=dtype) * 2 for n in (3 * state, state, state, state))
    expected, expected_grads = reference_elementwise(gates, old_cell, grad_h, grad_cell)
    forward = getattr(emulated, f"forward_{namespace(variant)}")
    backward = getattr(emulated, f"backward_{namespace(variant)}")
    problems = []

    def check(direction, report):
        launches = 1 if batch and state else 0  # an empty grid is not launched
        if report["launches"] != launches:
            problems.append(f"{direction}: {report['launches']} launches, not {launches}")
        if report["off_current_stream"]:
            problems.append(f"{direction}: a launch not on the current stream")
        if report["unchecked_launches"]:
            problems.append(f"{direction}: a launch not followed by a launch check")
        if report["damaged_bytes"]:
            problems.append(f"{direction}: {report['damaged_bytes']} canary bytes overwritten (a write out of bounds)")

    outputs = forward(inside_nan(gates), inside_nan(old_cell))
    check("forward", emulated.last_report())
    grads = backward(inside_nan(grad_h), inside_nan(grad_cell), inside_nan(expected[1]), inside_nan(gates))
    check("backward", emulated.last_report())
    for name, actual, wanted in zip(["new_h", "new_cell", "d_old_cell", "d_gates"], outputs + grads,
                                    expected + expected_grads):
        try:
            torch.testing.assert_close(actual, wanted, **tolerance)
        except AssertionError as error:
            problems.append(f"{name} differs from autograd: {str(error).splitlines()[0]}")
    return problems


# (batch, state): around the 32 x 8 block, an empty batch and state, and more rows than one
# grid holds (65535 blocks of 8 rows), so that threads loop over rows.
EMULATED_SHAPES = [(1, 1), (7, 33), (9, 31), (8, 32), (16, 128), (3, 257), (0, 5), (4, 0), (524_289, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_kernels_as_written_behave_on_the_cpu(emulated, dtype):
    for batch, state in EMULATED_SHAPES:
        if batch > 100_000 and dtype == torch.float32:
            continue  # the row loop once is enough (float64)
        assert judge(emulated, AS_WRITTEN, batch, state, dtype) == [], f"B{batch} S{state}"


# What each broken kernel must be caught for, at B = 7, S = 33 (neither a multiple of the block).
CAUGHT_FOR = {
    "no column guard": "canary bytes overwritten",
    "no row guard": "canary bytes overwritten",
    "default stream": "not on the current stream",
    "no launch check": "not followed by a launch check",
    "float-only expm1f": "differs from autograd",
}


@pytest.mark.parametrize("variant", sorted(BROKEN_KERNELS))
def test_each_broken_kernel_is_caught(emulated, variant):
    dtype = torch.float64  # the float-only maths shows only there
    problems = judge(emulated, variant, 7, 33, dtype)
    assert any(CAUGHT_FOR[variant] in problem for problem in problems), problems


def test_a_missing_guard_hides_on_sizes_that_fill_the_block(emulated):
    # At B = 8, S = 32 every thread of the grid has an element: the guards have nothing to stop,
    # which is why the shapes above are not multiples of the block.
    assert judge(emulated, "no column guard", 8, 32, torch.float32) == []
    assert judge(emulated, "no row guard", 8, 32, torch.float32) == []


# ---- 1c. The whole stage on the CPU: lltm.py, lltm_cuda.cpp and the kernels as written ----
# The host file compiled for the CPU beside the emulated kernels (emulated_host_file: its
# is_cuda() checks read is_cpu(), its device guard does nothing), put in place of the compiled
# module of the package imported from src/. What it checks: lltm.py and lltm_cuda.cpp, the
# interface between them and stage 11's two lessons, without a GPU. What it cannot check:
# cuBLAS, nvcc's code, the GPU's memory model, the CUDA-device checks (section 4 does, on a GPU).

SOURCE = source_package()


@pytest.fixture
def compiled_on_the_cpu(emulated, monkeypatch):
    """The source package running on the emulated host module (patched in for one test)."""
    monkeypatch.setattr(SOURCE.lltm, "_C", emulated.host)
    return SOURCE


class TestTheStageOnTheCpu(CellTests):
    """The recurrent-cell contract of common/ (outputs and five gradients against the reference
    in float32 and float64 on awkward shapes, gradcheck, only the requested gradients,
    non-contiguous inputs, bad inputs, a short training run) on the emulated stage."""

    make_cell = staticmethod(SOURCE.LLTM)
    function = staticmethod(SOURCE.LLTMFunction.apply)
    prefix = "lltm_cuda"
    device = "cpu"

    @pytest.fixture(autouse=True)
    def _on_the_cpu(self, compiled_on_the_cpu):
        pass


def test_the_host_guards_the_device_runs_its_gemms_on_aten_and_checks_what_it_is_given(emulated):
    """The host file's own duties, judged by what it does on the CPU: a device guard in forward
    and backward, the GEMMs on ATen (cuBLAS on a GPU), and a clear error for a tensor on another
    device or of another dtype (on the CPU the emulation's 'CUDA device' is the CPU: a meta tensor
    is elsewhere)."""
    from eml.common.cpp_checks import dispatched_ops

    host = emulated.host
    arguments = make_arguments(Shape(3, 5, 7), torch.float64)
    before = emulated.guards_made()
    new_h, new_cell, gates = host.forward(*arguments)
    grads = [torch.randn_like(new_h) for _ in range(2)]
    input, weights, _, old_h, _ = arguments
    host.backward(*grads, new_cell, gates, input, old_h, weights, True, True)
    assert emulated.guards_made() - before == 2, "one device guard in forward, one in backward"
    ops = dispatched_ops(lambda: (host.forward(*arguments), host.backward(*grads, new_cell, gates, input, old_h,
                                                                           weights, True, True)))
    assert "addmm" in ops and ops.count("mm") == 2, ops
    elsewhere = [arguments[0].to("meta"), *arguments[1:]]
    with pytest.raises(RuntimeError, match=r"^lltm_cuda: input must be a CUDA tensor, got device meta"):
        host.forward(*elsewhere)
    with pytest.raises(RuntimeError, match=r"^lltm_cuda: old_h is on meta but new_cell is on cpu"):
        host.backward(*grads, new_cell, gates, input, old_h.to("meta"), weights, True, True)
    with pytest.raises(RuntimeError, match=r"^lltm_cuda: weights is Float but new_cell is Double"):
        host.backward(*grads, new_cell, gates, input, old_h, weights.float(), True, True)


# Stage 11's interface checks, on the emulated stage (CPU) and, where there is one, on the GPU.

PACKAGE = installed_package() or SOURCE
BUILT = getattr(PACKAGE.lltm, "_C", None) is not None


@pytest.fixture(params=["emulated on the CPU", "cuda"])
def stage(request, background_builds):
    """(package, device): the package whose LLTMFunction runs, and where its tensors live.
    (background_builds, unused here, marks these tests as ones that wait on the background
    builds, which the root conftest.py runs last: the CPU case reaches the emulated build through
    request.getfixturevalue, which pytest cannot see before the test runs.)"""
    if request.param == "cuda":
        if not HAS_GPU or not BUILT:
            pytest.skip(NO_GPU if not HAS_GPU else "eml.lltm_cuda is not installed")
        return PACKAGE, "cuda"
    return request.getfixturevalue("compiled_on_the_cpu"), "cpu"


def test_forward_returns_h_cell_and_the_gates(stage):
    package, device = stage
    input, weights, bias, old_h, old_cell = make_arguments(Shape(4, 6, 5), torch.float64, device)
    new_h, new_cell, gates = package.lltm._C.forward(input, weights, bias, old_h, old_cell)
    assert [tuple(t.shape) for t in (new_h, new_cell, gates)] == [(4, 5), (4, 5), (4, 15)]
    torch.testing.assert_close(gates, torch.cat([old_h, input], 1) @ weights.t() + bias)
    expected = reference_lltm(input, weights, bias, old_h, old_cell)
    torch.testing.assert_close(new_h, expected[0])
    torch.testing.assert_close(new_cell, expected[1])


def test_backward_splits_d_x_at_the_state_size_when_f_differs_from_s(stage):
    # F = 9, S = 4: split(S, dim=1) would give d_old_h 4 columns and d_input only 4 of its 9.
    package, device = stage
    arguments = make_arguments(Shape(3, 9, 4), torch.float64, device)
    input, weights, bias, old_h, old_cell = arguments
    new_h, new_cell, gates = package.lltm._C.forward(*arguments)
    grad_h, grad_cell = torch.ones_like(new_h), torch.zeros_like(new_cell)
    d_old_h, d_input, d_weights, d_bias, d_old_cell = package.lltm._C.backward(
        grad_h, grad_cell, new_cell, gates, input, old_h, weights, True, True)
    assert d_old_h.shape == (3, 4) and d_input.shape == (3, 9) and d_bias.shape == (1, 12)
    leaves = [a.detach().requires_grad_() for a in arguments]
    reference_lltm(*leaves)[0].sum().backward()
    torch.testing.assert_close(d_input, leaves[0].grad)
    torch.testing.assert_close(d_old_h, leaves[3].grad)
    torch.testing.assert_close(d_weights, leaves[1].grad)


def test_backward_skips_the_gemms_nobody_asked_for(stage):
    package, device = stage
    input, weights, bias, old_h, old_cell = make_arguments(Shape(3, 5, 7), torch.float64, device)
    new_h, new_cell, gates = package.lltm._C.forward(input, weights, bias, old_h, old_cell)
    results = package.lltm._C.backward(new_h, new_cell, new_cell, gates, input, old_h, weights, False, False)
    assert [r is None for r in results] == [True, True, True, False, False]
    only_x = package.lltm._C.backward(new_h, new_cell, new_cell, gates, input, old_h, weights, True, False)
    assert [r is None for r in only_x] == [False, False, True, False, False]


def test_the_function_asks_only_for_the_gemms_autograd_needs(stage, monkeypatch):
    # The tutorial's benchmark: only the parameters require a gradient, so d_X = d_gates W is not needed.
    package, device = stage
    calls = []
    backward = package.lltm._C.backward

    class Recording:  # the compiled module with its backward's two flags recorded
        forward = staticmethod(package.lltm._C.forward)

        @staticmethod
        def backward(*arguments):
            calls.append(arguments[-2:])
            return backward(*arguments)

    monkeypatch.setattr(package.lltm, "_C", Recording)
    input, weights, bias, old_h, old_cell = make_arguments(Shape(3, 5, 7), torch.float64, device)
    weights.requires_grad_()
    new_h, new_cell = package.LLTMFunction.apply(input, weights, bias, old_h, old_cell)
    (new_h.sum() + new_cell.sum()).backward()
    old_h.requires_grad_()
    new_h, new_cell = package.LLTMFunction.apply(input, weights, bias, old_h, old_cell)
    (new_h.sum() + new_cell.sum()).backward()
    assert calls == [(False, True), (True, True)]  # (need_d_X, need_d_weights)


def saved_bytes(function, arguments):
    """Bytes of the tensors the Function saves for the backward that are not its inputs or outputs."""
    extra = {}

    def pack(tensor):
        extra[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    leaves = [a.detach().requires_grad_() for a in arguments]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outputs = function(*leaves)
    known = {t.untyped_storage().data_ptr() for t in (*leaves, *outputs)}
    return sum(size for pointer, size in extra.items() if pointer not in known)


def test_saves_only_the_gates_for_the_backward(stage):
    package, device = stage
    shape = Shape(64, 1024, 128)
    arguments = make_arguments(shape, torch.float32, device)
    assert saved_bytes(package.LLTMFunction.apply, arguments) == shape.batch * 3 * shape.state * 4


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


# ---- 3. setup.py, benchmark.py and gpu_run.sh where there is no CUDA ----

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


def run_benchmark_on_a_pretend_gpu(monkeypatch, cells, check_cell):
    """benchmark.main with the GPU and the cells faked: which cells reach the timing, and its exit status."""
    spec = importlib.util.spec_from_file_location("stage12_benchmark", STAGE / "benchmark.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    from eml.common import lltm_bench
    monkeypatch.setattr(torch.version, "cuda", "12.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "a pretend GPU")
    monkeypatch.setattr(benchmark, "gpu_cells",
                        lambda kind=None: {label: make for label, (key, make) in cells.items() if kind in (None, key)})
    monkeypatch.setattr(lltm_bench, "check_cell", check_cell)
    timed = []
    monkeypatch.setattr(lltm_bench, "benchmark", lambda makers, *args, **kwargs: timed.extend(makers))
    return benchmark.main(["--quick"]), timed


def test_benchmark_leaves_out_only_a_cpu_cell_that_refuses_cuda_tensors(monkeypatch):
    def check_cell(make, device):
        if make == "cpu only":
            raise RuntimeError("lltm_fused: input must be a CPU tensor, got device cuda:0")
        if make == "broken":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return True, "ok"

    status, timed = run_benchmark_on_a_pretend_gpu(
        monkeypatch, {"09": ("cells", "fine"), "11": ("cells", "cpu only"), "12": ("cuda_cells", "fine")}, check_cell)
    assert (status, timed) == (0, ["09", "12"])
    # Any other error is raised, from a CPU cell or a GPU cell; so is a GPU cell's refusal.
    for cells in ({"09": ("cells", "fine"), "10": ("cells", "broken")},
                  {"09": ("cells", "fine"), "12": ("cuda_cells", "broken")},
                  {"09": ("cells", "fine"), "12": ("cuda_cells", "cpu only")}):
        with pytest.raises(RuntimeError):
            run_benchmark_on_a_pretend_gpu(monkeypatch, cells, check_cell)
    # A cell that fails the check is left out, and the exit status says so.
    status, timed = run_benchmark_on_a_pretend_gpu(
        monkeypatch, {"09": ("cells", "fine"), "12": ("cuda_cells", "wrong")},
        lambda make, device: (make == "fine", "checked"))
    assert (status, timed) == (1, ["09"])


@pytest.mark.skipif(HAS_GPU, reason="a GPU is here: gpu_run.sh would install and run everything")
def test_gpu_run_stops_with_one_line_without_a_gpu(tmp_path):
    result = subprocess.run(["bash", str(STAGE / "gpu_run.sh"), str(tmp_path)], capture_output=True, text=True,
                            env=dict(os.environ, PYTHON=sys.executable, PYTHONWARNINGS="ignore"))
    assert result.returncode == 1
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpu_run.sh: needs a GPU and a CUDA build of torch"), lines
    assert list(tmp_path.iterdir()) == [], "nothing is installed or logged without a GPU"


# ---- 4. On a GPU: the recurrent-cell contract of common/, on CUDA tensors ----

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
    input, weights, bias, old_h, old_cell = arguments
    new_h, new_cell, gates = PACKAGE.lltm._C.forward(*arguments)
    saved = [new_cell, gates, input, old_h, weights, True, True]
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
