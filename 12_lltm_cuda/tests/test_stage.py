"""Stage 12's tests, in two halves.

Without a GPU (this tutorial's own machines: torch's CPU build) the stage is not installed, and
the tests that run the kernels skip with the reason. What can be checked without a GPU still
runs: the CUDA and C++ sources are read for the defects the seed texts are known for (a launch
on the default stream, no launch check, a bounds guard missing on one dimension, float-only
maths such as fmaxf on doubles, raw pointers instead of packed accessors), each check is shown
to fail on a broken snippet, the Python package imports from its source folder and raises a
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


# ---- 2. The Python package without the compiled module ----

def test_package_imports_from_source_without_the_extension():
    package = source_package()
    cell = package.LLTM(5, 7)
    assert cell.weights.shape == (21, 12) and cell.bias.shape == (21,)
    bound = 1 / 7 ** 0.5
    assert all(p.abs().max() <= bound for p in cell.parameters())
    assert package.TOUR == {} or isinstance(package.TOUR, dict)


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


# ---- 4. On a GPU: the kernels against a reference ----

PACKAGE = installed_package() or source_package()
BUILT = getattr(PACKAGE.lltm, "_C", None) is not None
needs_kernels = pytest.mark.skipif(
    not HAS_GPU or not BUILT,
    reason=NO_GPU if not HAS_GPU else "eml.lltm_cuda is not installed: pip install --no-build-isolation ./12_lltm_cuda",
)

TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12)}

# (batch, features, state): state sizes around the 32-wide block (1, 31, 33, 127, 257, 1000),
# batches around the 8-row block, F != S, empty batch and empty state, the tutorial's size.
SHAPES = [(1, 1, 1), (3, 5, 31), (7, 13, 33), (9, 32, 127), (16, 32, 128), (5, 3, 257), (13, 100, 1000),
          (0, 5, 7), (4, 6, 0)]


def reference_cell(input, weights, bias, old_h, old_cell):
    """The LLTM's formulas in plain torch ops; autograd gives the reference gradients."""
    X = torch.cat([old_h, input], dim=1)
    gates = torch.nn.functional.linear(X, weights, bias.reshape(-1))
    state = old_h.shape[1]
    input_gate, output_gate, candidate = gates[:, :state], gates[:, state:2 * state], gates[:, 2 * state:]
    new_cell = old_cell + torch.nn.functional.elu(candidate) * torch.sigmoid(input_gate)
    return torch.tanh(new_cell) * torch.sigmoid(output_gate), new_cell


def make_arguments(batch, features, state, dtype, seed=0, bias_shape=None):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, features), (3 * state, state + features), bias_shape or (3 * state,), (batch, state), (batch, state)]
    return [torch.randn(*shape, generator=generator, dtype=dtype).cuda().requires_grad_() for shape in shapes]


def outputs_and_grads(function, arguments, seed=1):
    arguments = [a.detach().requires_grad_() for a in arguments]  # detach keeps the strides, clone may not
    new_h, new_cell = function(*arguments)
    generator = torch.Generator().manual_seed(seed)
    grad_h, grad_cell = (torch.randn(t.shape, generator=generator, dtype=t.dtype).cuda() for t in (new_h, new_cell))
    torch.autograd.backward([new_h, new_cell], [grad_h, grad_cell])
    return [new_h, new_cell] + [a.grad for a in arguments]


NAMES = ["new_h", "new_cell", "grad_input", "grad_weights", "grad_bias", "grad_old_h", "grad_old_cell"]


def assert_matches_reference(arguments, dtype):
    ours = outputs_and_grads(PACKAGE.LLTMFunction.apply, arguments)
    expected = outputs_and_grads(reference_cell, arguments)
    for name, actual, wanted in zip(NAMES, ours, expected):
        assert actual.shape == wanted.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(wanted.shape)}"
        torch.testing.assert_close(actual, wanted, **TOLERANCES[dtype], msg=lambda m: f"{name}: {m}")


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"B{b}xF{f}xS{s}" for b, f, s in SHAPES])
def test_outputs_and_gradients_match_the_reference(shape, dtype):
    assert_matches_reference(make_arguments(*shape, dtype), dtype)


@needs_kernels
def test_bias_of_shape_1_by_3s_gets_its_gradient_in_that_shape():
    arguments = make_arguments(3, 5, 33, torch.float64, bias_shape=(1, 99))
    assert_matches_reference(arguments, torch.float64)


@needs_kernels
def test_more_rows_than_one_grid_can_hold():
    # 600001 rows: more than 65535 blocks of 8 rows, so each thread loops over several rows.
    # float64: the weight gradient sums 600001 products, too many for a float32 tolerance.
    assert_matches_reference(make_arguments(600_001, 2, 3, torch.float64), torch.float64)


@needs_kernels
def test_non_contiguous_inputs():
    arguments = [a.detach() for a in make_arguments(6, 5, 33, torch.float64)]
    strided = [torch.cat([a, a], dim=-1)[..., ::2] for a in arguments]  # every other column
    assert not any(s.is_contiguous() for s in strided if s.numel() > 1)
    assert_matches_reference(strided, torch.float64)


@needs_kernels
@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 3, 33)])
def test_gradcheck_float64(shape):
    arguments = make_arguments(*shape, torch.float64)
    assert torch.autograd.gradcheck(PACKAGE.LLTMFunction.apply, arguments)


@needs_kernels
def test_only_the_requested_gradients():
    arguments = [a.detach() for a in make_arguments(3, 5, 7, torch.float64)]
    arguments[1].requires_grad_()  # only the weights
    new_h, new_cell = PACKAGE.LLTMFunction.apply(*arguments)
    (new_h.sum() + new_cell.sum()).backward()
    assert arguments[1].grad is not None
    assert all(a.grad is None for i, a in enumerate(arguments) if i != 1)


@needs_kernels
def test_second_backward_raises():
    arguments = make_arguments(3, 5, 7, torch.float64)
    new_h, new_cell = PACKAGE.LLTMFunction.apply(*arguments)
    grads = torch.autograd.grad(new_h.sum() + new_cell.sum(), arguments, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        sum(g.sum() for g in grads).backward()


@needs_kernels
def test_module_forward_on_cuda():
    cell = PACKAGE.LLTM(5, 33).cuda()
    input, old_h, old_cell = torch.randn(4, 5).cuda(), torch.randn(4, 33).cuda(), torch.randn(4, 33).cuda()
    new_h, new_cell = cell(input, (old_h, old_cell))
    expected = reference_cell(input, cell.weights, cell.bias, old_h, old_cell)
    torch.testing.assert_close(new_h, expected[0], **TOLERANCES[torch.float32])
    torch.testing.assert_close(new_cell, expected[1], **TOLERANCES[torch.float32])


# ---- 5. On a GPU: streams, graph capture, both build routes ----

@needs_kernels
def test_a_non_default_stream_gives_the_same_result():
    arguments = [a.detach() for a in make_arguments(9, 13, 33, torch.float32)]
    expected = outputs_and_grads(PACKAGE.LLTMFunction.apply, arguments)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000)  # keep the side stream busy: work on another stream would race ahead
        actual = outputs_and_grads(PACKAGE.LLTMFunction.apply, arguments)
    torch.cuda.current_stream().wait_stream(stream)
    for name, a, b in zip(NAMES, actual, expected):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")


@needs_kernels
def test_launches_go_to_the_current_stream_under_graph_capture():
    # During a CUDA graph capture, a launch on the legacy default stream fails the capture:
    # the forward and the backward capture and replay only if every launch is on the current stream.
    arguments = [a.detach() for a in make_arguments(9, 13, 33, torch.float32)]
    static = [a.clone().requires_grad_() for a in arguments]
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
    eager = PACKAGE.LLTMFunction.apply(*static)
    torch.testing.assert_close(new_h, eager[0])
    torch.testing.assert_close(new_cell, eager[1])
    assert all(torch.isfinite(g).all() for g in grads)


@needs_kernels
def test_setup_py_route_is_a_compiled_module_in_the_package():
    compiled = PACKAGE.lltm._C
    assert compiled.__file__.endswith(".so") and compiled.__name__ == "eml.lltm_cuda._C"


@needs_kernels
def test_jit_route_builds_the_same_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    module = importlib.import_module(PACKAGE.__name__ + ".jit").build()
    assert str(tmp_path) in module.__file__
    arguments = [a.detach() for a in make_arguments(7, 13, 33, torch.float64)]
    for jit, installed in zip(module.forward(*arguments), PACKAGE.lltm._C.forward(*arguments)):
        torch.testing.assert_close(jit, installed, rtol=0, atol=0)


# ---- 6. On a GPU: every input error names the problem and the value ----

def bad_arguments(**changes):
    arguments = dict(zip(["input", "weights", "bias", "old_h", "old_cell"],
                         [a.detach() for a in make_arguments(3, 5, 7, torch.float32)]))
    for name, change in changes.items():
        arguments[name] = change(arguments[name])
    return list(arguments.values())


BAD_INPUTS = {
    "input on the CPU": (dict(input=lambda t: t.cpu()), r"input must be a CUDA tensor, got device cpu"),
    "weights on the CPU": (dict(weights=lambda t: t.cpu()), r"weights must be a CUDA tensor, got device cpu"),
    "float16": (dict(input=lambda t: t.half(), weights=lambda t: t.half(), bias=lambda t: t.half(),
                     old_h=lambda t: t.half(), old_cell=lambda t: t.half()), r"input must be float32 or float64, got Half"),
    "integer": (dict(old_cell=lambda t: t.int()), r"old_cell must be float32 or float64, got Int"),
    "mixed dtypes": (dict(bias=lambda t: t.double()), r"bias is Double but input is Float"),
    "1-D input": (dict(input=lambda t: t[0]), r"input must be 2-D \(batch, features\), got shape \[5\]"),
    "batch of old_h": (dict(old_h=lambda t: t[:2]), r"old_h has batch size 2 but input has 3"),
    "old_cell's state": (dict(old_cell=lambda t: t[:, :6]), r"old_cell must have shape \[3, 7\], got \[3, 6\]"),
    "weights' features": (dict(weights=lambda t: t[:, :11]), r"weights must have shape \[21, 12\], got \[21, 11\]"),
    "bias": (dict(bias=lambda t: t[:20]), r"bias must have shape \(21\) or \(1, 21\), got \[20\]"),
}


@needs_kernels
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_a_clear_error(case):
    changes, pattern = BAD_INPUTS[case]
    with pytest.raises(RuntimeError, match="lltm_cuda: " + pattern):
        PACKAGE.LLTMFunction.apply(*bad_arguments(**changes))


@needs_kernels
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_two_gpus_are_a_clear_error():
    with pytest.raises(RuntimeError, match=r"lltm_cuda: old_h is on cuda:1 but input is on cuda:0"):
        PACKAGE.LLTMFunction.apply(*bad_arguments(old_h=lambda t: t.to("cuda:1")))
