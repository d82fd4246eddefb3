"""Stage 16's tests: stage 08's, for the same layer on LibTorch's stable ABI, and what is new here:
the module imports no libtorch C++ symbol (and the check finds stage 08's), no source includes a
libtorch C++ header, the library loaded by path gets its Python halves in a fresh process, 08 and
16 agree bit for bit in one process, and the abi3 wheel in a fresh venv. The shared contracts
(common/), opcheck, torch.compile, torch.export, vmap, autocast, bfloat16, save/load, deepcopy,
activation checkpointing, the process-wide state, a NULL kernel and a missing LIBXSMM as clear
errors: as in 08. A second torch version is checked by other_torch_check.sh, not here (README)."""

import importlib.metadata
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import venv

import pytest
import torch
import torch.nn.functional as F

from eml.common import op_checks
from eml.common.checks import CASES, Case, FunctionTests, LayerTests, assert_close, expect_error
from eml.common.cpp_checks import (
    AWKWARD, CppModuleTests, assert_exports_no_symbol_of, assert_imports_no_libtorch_cpp_symbol, assert_no_matrix_product,
    assert_results_close, everything,
    expected_grads, tensors,
)
from eml.common.cpp_checks import MATRIX_PRODUCT_OPS, assert_matches_torch_in_turns_and_on_two_threads
from eml.linear_stable import TOUR, Layer, _C, ops as ops_module, peak_gflops
from eml.linear_stable.ops import FLAG_BETA_0, FLAG_TRANS_A, FLAG_TRANS_B, ops

STAGE = pathlib.Path(__file__).resolve().parents[1]  # 16_stable_abi/, as shipped in the repository
OPS = {"linear": ops.linear, "linear_grad_input": ops.linear_grad_input,
       "linear_grad_weight": ops.linear_grad_weight, "linear_grad_bias": ops.linear_grad_bias}


class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)
    double_backward = True  # the backward ops have a backward of their own (ops.py)


class TestOp(FunctionTests):
    linear = staticmethod(ops.linear)  # the op, called directly: autograd registered for it
    double_backward = True


class TestModule(CppModuleTests):
    """The course's forward/backward (ops.py, on the ops) under common's contract for a C++ module."""

    prefix = "linear_stable"
    module = ops_module
    compiled = _C  # ops.py runs the ops; _C.abi3.so holds their kernels
    bitwise_across_threads = True  # each tile: one thread, the same kernels in the same order

    def forward(self, input, weight, bias):
        return ops_module.forward(input, weight, bias)

    def backward(self, grad_output, input, weight, need_input, need_weight, need_bias):
        return ops_module.backward(grad_output, input, weight, need_input, need_weight, need_bias)

    def apply(self, input, weight, bias):
        return ops.linear(input, weight, bias), ()  # autograd calls backward(..., *needs) and nothing else


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", AWKWARD, ids=str)
def test_awkward_shapes_match_torch(case, dtype, bias):
    input, weight, bias_tensor, grad_output = tensors(case, dtype)
    bias_tensor = bias_tensor if bias else None
    want = [F.linear(input, weight, bias_tensor), *expected_grads(input, weight, grad_output)]
    assert_results_close(everything(ops_module, input, weight, bias_tensor, grad_output), want, case, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_long_reductions_add_up_in_chunks(dtype):
    """K of about 1000 in every product: more k steps than one 256 KB chunk of packed B holds
    with the default blocking, so later chunks add their tiles into C. (grad_bias is an op of
    its own here, a plain column sum: 06 and 07 test its fusion into grad_weight.)"""
    case = Case((1031,), 1037, 1033)
    input, weight, bias, grad_output = tensors(case, dtype)
    want = [F.linear(input, weight, bias), *expected_grads(input, weight, grad_output)]
    assert_results_close(everything(ops_module, input, weight, bias, grad_output), want, case, dtype)


def test_packs_for_one_call_fit_in_turns_and_on_two_threads():
    assert_matches_torch_in_turns_and_on_two_threads(ops_module)


# -- opcheck: every op, the shared samples, float32, float64 and bfloat16, with and without grad --
def test_opcheck_linear_on_the_shared_samples():
    counts = op_checks.opcheck_all(ops.linear.default, op_checks.linear_samples())
    assert counts == {test: len(op_checks.linear_samples()) for test in op_checks.OPCHECK_TESTS}


@pytest.mark.parametrize("name", ["grad_input", "grad_weight", "grad_bias"])
def test_opcheck_backward_ops_on_the_shared_samples(name):
    samples = op_checks.linear_backward_samples()[name]
    assert {s.args[0].dtype for s in samples} == set(op_checks.OP_DTYPES)
    op_checks.opcheck_all(OPS[f"linear_{name}"].default, samples)


def test_schemas_are_functional():
    expected = {
        "linear": "eml_stable::linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor",
        "linear_grad_input": "eml_stable::linear_grad_input(Tensor grad_output, Tensor weight) -> Tensor",
        "linear_grad_weight": "eml_stable::linear_grad_weight(Tensor grad_output, Tensor input) -> Tensor",
        "linear_grad_bias": "eml_stable::linear_grad_bias(Tensor grad_output) -> Tensor",
    }
    for name, schema in expected.items():
        op = OPS[name].default
        assert str(op._schema) == schema
        assert not any(arg.alias_info for arg in op._schema.arguments), f"{name} declares a mutation or alias"


# -- torch.compile: one graph, eager results, several batch sizes with dynamic shapes ------------
def test_compiled_mlp_has_no_graph_break():
    model = op_checks.mlp(Layer)
    explanation = op_checks.assert_no_graph_break(model, torch.randn(5, 16))
    assert explanation.graph_break_count == 0


def test_compiled_mlp_matches_eager_nn_linear():
    """fullgraph=True, dynamic=True, inductor: outputs and every gradient against nn.Linear's MLP."""
    op_checks.assert_compiled_matches(op_checks.mlp(Layer), op_checks.mlp(torch.nn.Linear), batch_sizes=[2, 7, 33])


def test_bad_input_is_refused_while_tracing():
    """Under torch.compile the C++ kernel never sees the fake tensors: the fake kernel's checks
    give the same message at trace time."""
    torch._dynamo.reset()
    compiled = torch.compile(Layer(8, 3), backend="eager", fullgraph=True)
    expect_error(lambda: compiled(torch.randn(4, 7)), r"linear_stable: ", r"input features", r"\b7\b", r"\b8\b")


def test_the_fake_kernel_checks_on_its_own():
    """Under FakeTensorMode only the fake kernel runs (the C++ kernel would need real data): it
    alone refuses a feature-count mismatch, a bias of the wrong size and a dtype that differs
    from the weight's, each in the C++ kernel's wording (with torch's dtype names)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(4, 7), torch.empty(3, 8)
        expect_error(lambda: torch.ops.eml_stable.linear(x, w, None), r"^linear_stable: ", r"input features", r"\b7\b", r"\b8\b")
        expect_error(lambda: torch.ops.eml_stable.linear(torch.empty(4, 8), w, torch.empty(5)), r"^linear_stable: ", r"bias", r"\b3\b", r"\b5\b")
        expect_error(lambda: torch.ops.eml_stable.linear(torch.empty(4, 8, dtype=torch.float64), w, None), r"^linear_stable: ", r"float64")
        assert torch.ops.eml_stable.linear(torch.empty(2, 4, 8), w, None).shape == (2, 4, 3)


# -- torch.export: a dynamic batch dimension, then new batch sizes -------------------------------
def test_export_with_a_dynamic_batch():
    model = op_checks.mlp(Layer)
    exported = op_checks.assert_export_runs(model, torch.randn(4, 16), new_batch_sizes=[1, 3, 50])
    targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
    assert targets.count("eml_stable.linear.default") == 3, targets  # the op itself, not its decomposition


def test_exported_program_saves_and_loads(tmp_path):
    model = op_checks.mlp(Layer)
    exported = torch.export.export(model, (torch.randn(4, 16),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(exported, tmp_path / "mlp.pt2")
    loaded = torch.export.load(tmp_path / "mlp.pt2").module()
    x = torch.randn(9, 16)
    assert_close(loaded(x), model(x), torch.float32, "loaded exported program")


# -- vmap ------------------------------------------------------------------------------------------
def test_vmap_batched_input_one_weight():
    layer = Layer(7, 5)
    xs = torch.randn(4, 3, 7)
    got = torch.func.vmap(layer)(xs)
    assert_close(got, F.linear(xs, layer.weight, layer.bias), torch.float32, "vmap over a batch of inputs")
    # in_dims elsewhere than 0, and a 1-d input per element
    xs_t = torch.randn(7, 6)
    got = torch.func.vmap(layer, in_dims=1)(xs_t)
    assert_close(got, F.linear(xs_t.t(), layer.weight, layer.bias), torch.float32, "vmap, in_dims=1")
    # autograd through the vmapped forward: the gradients of nn.Linear on the unbatched view
    xs = xs.requires_grad_()
    torch.func.vmap(layer)(xs).pow(2).sum().backward()
    reference = torch.nn.Linear(7, 5)
    reference.load_state_dict(layer.state_dict())
    x_ref = xs.detach().requires_grad_()
    reference(x_ref).pow(2).sum().backward()
    for name, got, want in [("input", xs.grad, x_ref.grad), ("weight", layer.weight.grad, reference.weight.grad),
                            ("bias", layer.bias.grad, reference.bias.grad)]:
        assert_close(got, want, torch.float32, f"grad_{name} through vmap")


@pytest.mark.parametrize("shared_input", [True, False], ids=["one-input", "input-per-member"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_vmap_ensemble_of_stacked_weights(shared_input, bias):
    """torch.func.stack_module_state + functional_call, as in PyTorch's model-ensembling tutorial."""
    models = [torch.nn.Sequential(Layer(6, 9, bias=bias), torch.nn.ReLU(), Layer(9, 4, bias=bias)) for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    base = models[0]

    def run(params, buffers, x):
        return torch.func.functional_call(base, (params, buffers), (x,))

    x = torch.randn(3, 5, 6) if not shared_input else torch.randn(5, 6)
    got = torch.func.vmap(run, in_dims=(0, 0, None if shared_input else 0))(params, buffers, x)
    want = torch.stack([m(x if shared_input else x[i]) for i, m in enumerate(models)])
    assert_close(got, want, torch.float32, "ensemble")


def test_vmap_of_the_backward_ops():
    gy, w, x = torch.randn(4, 3, 5), torch.randn(5, 7), torch.randn(4, 3, 7)
    assert_close(torch.func.vmap(ops.linear_grad_input, in_dims=(0, None))(gy, w), gy @ w, torch.float32, "grad_input")
    assert_close(torch.func.vmap(ops.linear_grad_weight)(gy, x), gy.transpose(1, 2) @ x, torch.float32, "per-sample grad_weight")
    assert_close(torch.func.vmap(ops.linear_grad_bias)(gy), gy.sum(1), torch.float32, "grad_bias")


def test_func_grad_is_refused_clearly():
    """A limit of torch 2.13's register_autograd, not of this op: torch.func.grad (and so
    vmap(grad(...)) per-sample gradients) needs a setup_context the generated Function lacks.
    Use autograd (torch.autograd.grad) or the vmapped backward ops (test above) instead."""
    w, x = torch.randn(3, 7), torch.randn(5, 7)
    expect_error(lambda: torch.func.grad(lambda w: ops.linear(x, w, None).sum())(w), r"setup_context")


# -- autocast: as nn.Linear -------------------------------------------------------------------------
def test_autocast_like_nn_linear():
    torch.manual_seed(0)
    reference = torch.nn.Linear(33, 17)
    layer = Layer(33, 17)
    layer.load_state_dict(reference.state_dict())
    x = torch.randn(8, 33, requires_grad=True)
    results = []
    for module in (reference, layer):
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = module(x)
        y.float().pow(2).sum().backward()
        results.append((y, x.grad.clone(), module.weight.grad, module.bias.grad))
    (y_ref, gx_ref, gw_ref, gb_ref), (y, gx, gw, gb) = results
    assert y.dtype == y_ref.dtype == torch.bfloat16
    assert gx.dtype == gw.dtype == gb.dtype == torch.float32, "the parameters and their gradients stay float32"
    tolerance = op_checks.TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(y.float(), y_ref.float(), **tolerance)
    for name, got, want in [("input", gx, gx_ref), ("weight", gw, gw_ref), ("bias", gb, gb_ref)]:
        scale = want.abs().max()  # bfloat16 sums: compare relative to the gradient's size
        torch.testing.assert_close(got / scale, want / scale, rtol=0, atol=3e-2, msg=lambda m: f"grad_{name}: {m}")


def test_autocast_to_float16_still_computes_in_bfloat16():
    """The one difference from nn.Linear: no float16 kernel here, so the rule casts to bfloat16."""
    with torch.autocast("cpu", dtype=torch.float16):
        assert Layer(5, 3)(torch.randn(2, 5)).dtype == torch.bfloat16
        assert torch.nn.Linear(5, 3)(torch.randn(2, 5)).dtype == torch.float16


def test_no_autocast_outside_the_region():
    layer = Layer(5, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert layer(torch.randn(2, 5)).dtype == torch.float32


# -- bfloat16: float32 kernels, one rounding ---------------------------------------------------------
@pytest.mark.parametrize("case", [Case((37,), 61, 53), Case((2, 5), 33, 65), Case((1,), 1, 1), Case((0,), 5, 3)], ids=str)
def test_bfloat16_is_float32_rounded_once(case):
    input, weight, bias, grad_output = (t.bfloat16() for t in tensors(case, torch.float32))
    got = everything(ops_module, input, weight, bias, grad_output)
    wide = [t.float() for t in (input, weight, bias, grad_output)]
    want = [F.linear(*wide[:3]), *expected_grads(wide[0], wide[1], wide[3])]
    for name, g, w in zip(["output", "grad_input", "grad_weight", "grad_bias"], got, want):
        assert g.dtype == torch.bfloat16, name
        # against torch's float32 result: within one bfloat16 ulp (2^-8 to 2^-7 relative), since
        # the two float32 sums may differ in their last bits and round to neighbouring bfloat16 values
        torch.testing.assert_close(g.float(), w.bfloat16().float(), rtol=2 ** -7, atol=1e-5, msg=lambda m: f"{name}: {m}")
    # Rounded once, exactly: bitwise the stage's own float32 path on the same (widened) values,
    # rounded to bfloat16 at the end; a second rounding on the way (say, the bias added in
    # bfloat16) would differ in the last bit somewhere.
    own = everything(ops_module, *wide)
    for name, g, w in zip(["output", "grad_input", "grad_weight", "grad_bias"], got, own):
        assert torch.equal(g, w.bfloat16()), f"{name}: not the stage's float32 result rounded once"


def test_bfloat16_mlp_forward_and_gradients_close_to_float32():
    op_checks.assert_bf16_mlp_close_to_float32(Layer)


# -- modules: save/load, deepcopy, activation checkpointing -----------------------------------------
def test_save_load_and_deepcopy():
    model = op_checks.mlp(Layer)
    twin, loaded = op_checks.round_trip(model)
    x = torch.randn(5, 16)
    for name, other in [("deepcopy", twin), ("torch.save / torch.load", loaded)]:
        assert_close(other(x), model(x), torch.float32, name)
        assert all(p is not q for p, q in zip(other.parameters(), model.parameters()))


def test_activation_checkpointing():
    from torch.utils.checkpoint import checkpoint

    model = op_checks.mlp(Layer)
    x = torch.randn(6, 16, requires_grad=True)
    plain = torch.autograd.grad(model(x).sum(), [x, *model.parameters()])
    checkpointed = torch.autograd.grad(checkpoint(model, x, use_reentrant=False).sum(), [x, *model.parameters()])
    for a, b in zip(plain, checkpointed):
        assert torch.equal(a, b), "recomputing the forward gives bitwise the same gradients"


def test_ddp_two_ranks_match_one_process(tmp_path):
    """DistributedDataParallel on gloo, two processes on half a batch each: nn.Linear's drop-in there too."""
    op_checks.assert_ddp_matches_one_process("eml.linear_stable:Layer", tmp_path)


# -- the process-wide state -------------------------------------------------------------------------
def test_one_state_per_shape_shared_by_every_layer():
    before = ops.tpp_states()
    layers = [Layer(23, 41), Layer(23, 41)]
    assert ops.tpp_states() == before, "a Layer holds no state: nothing is made at construction"
    for n in (1, 5, 70):
        for layer in layers:
            layer(torch.randn(n, 23)).sum().backward()
    assert ops.tpp_states() == before + 1, "one state for (23, 41), whatever the layer, batch or dtype"
    layers[0].double()(torch.randn(3, 23, dtype=torch.float64))
    assert ops.tpp_states() == before + 1


# -- carried over from stage 06 ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_null_kernel_is_a_clear_error(dtype):
    message = expect_error(
        lambda: ops.tpp_dispatch_check(48, 32, 16, FLAG_TRANS_A, dtype),
        r"^linear_stable: ", r"NULL", r"m=48", r"n=32", r"k=16", r"lda=16", r"ldb=16", r"ldc=48", r"flags=1 \(TRANS_A\)",
        "float32" if dtype == torch.float32 else "float64",
    )
    # the version LIBXSMM reports, where the message names it (its fixed tail names 1.17 too)
    assert re.search(r"LIBXSMM \d+\.\d+\S* returned no kernel \(NULL\)", message)
    assert ops.tpp_dispatch_check(48, 32, 16, FLAG_TRANS_B | FLAG_BETA_0, dtype) is True


def test_setup_without_libxsmm_names_the_package(tmp_path):
    shutil.copy(STAGE / "setup.py", tmp_path / "setup.py")
    empty = tmp_path / "include"
    empty.mkdir()
    env = dict(os.environ, LIBXSMM_INCLUDE_DIR=str(empty), PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "sudo apt-get install -y libxsmm-dev" in result.stderr, result.stderr
    assert str(empty) in result.stderr, "the message says where it looked"
    assert not (tmp_path / "build").exists(), "it stopped before compiling"


def test_peak_probe_returns_a_positive_finite_number():
    peak = peak_gflops()
    assert isinstance(peak, float) and math.isfinite(peak) and peak > 0


def test_tour_registration():
    assert TOUR["layers"] == {"16 stable ABI": Layer}
    assert TOUR["compile_layers"] == {"16 stable ABI": Layer}
    assert TOUR["peak_gflops"] is peak_gflops
    points = {point.name: point for point in importlib.metadata.entry_points(group="eml.tour")}
    assert points["16_stable_abi"].value == "eml.linear_stable:TOUR"


def test_half_is_refused_by_name():
    x, w = torch.randn(4, 6), torch.randn(3, 6)
    expect_error(lambda: ops.linear(x.half(), w.half(), None), r"^linear_stable: ", r"dtype", r"Half")


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_libxsmm_stays_inside_the_module():
    symbols = subprocess.run(["nm", "-D", "--defined-only", _C.__file__], capture_output=True, text=True, check=True).stdout
    leaked = [line.split()[-1] for line in symbols.splitlines() if re.search(r"\b(libxsmm_\w+|[sd]gemm_?)$", line)]
    assert not leaked, f"_C exports LIBXSMM symbols: {leaked[:5]}"


def test_exports_no_cpp_symbol_of_its_own():
    """Stages 06, 07, 08 and 16 share the C++ namespace tpp: one process loads them all."""
    assert_exports_no_symbol_of(_C.__file__, "tpp")


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_module_is_abi3_and_needs_no_pybind11_nor_torch_python():
    """Python's stable ABI: one file for every CPython >= 3.10; no pybind11, no libtorch_python."""
    assert pathlib.Path(_C.__file__).name == "_C.abi3.so"
    needed = subprocess.run(["readelf", "-d", _C.__file__], capture_output=True, text=True).stdout
    assert "torch_python" not in needed, "linked against libtorch_python: not limited-API"
    undefined = subprocess.run(["nm", "-D", "--undefined-only", _C.__file__], capture_output=True, text=True, check=True).stdout
    assert "pybind11" not in undefined and "THPVariable" not in undefined
    python_symbols = {line.split()[-1] for line in undefined.splitlines() if re.search(r"\b_?Py", line)}
    # the module's creation, and the import of ops.py when loaded by path (bindings.cpp, section 5)
    allowed = {"PyModule_Create2", "PyGILState_Ensure", "PyGILState_Release", "PySys_GetObject", "PyUnicode_FromString",
               "PyDict_Contains", "PyImport_Import", "PyErr_Fetch", "PyObject_Str", "PyUnicode_AsUTF8AndSize",
               "PyErr_Clear", "PyErr_WarnEx", "_Py_Dealloc"}
    assert python_symbols <= allowed, f"Python symbols beyond the limited API's few: {python_symbols - allowed}"


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_loads_in_a_program_without_python(tmp_path):
    """A C program, no Python in the process, dlopens the module: the registrations run (libtorch
    is C++, it needs no Python) and the import of ops.py is skipped, since every Python function
    the module calls is bound only when first called (lazy binding: the program dlopens with
    RTLD_LAZY) and Py_IsInitialized is looked up, not linked."""
    program = tmp_path / "load.c"
    program.write_text(
        "#include <dlfcn.h>\n#include <stdio.h>\n"
        "int main(int argc, char** argv) {\n"
        "  void* handle = dlopen(argv[1], RTLD_LAZY);\n"
        "  if (!handle) { printf(\"dlopen failed: %s\\n\", dlerror()); return 1; }\n"
        "  printf(\"loaded without Python\\n\");\n  return 0;\n}\n")
    subprocess.run(["cc", "-o", str(tmp_path / "load"), str(program), "-ldl"], check=True, timeout=120)
    torch_lib = pathlib.Path(torch.__file__).parent / "lib"
    result = subprocess.run([str(tmp_path / "load"), _C.__file__], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, LD_LIBRARY_PATH=str(torch_lib)))
    assert result.returncode == 0 and result.stdout.strip() == "loaded without Python", result.stdout + result.stderr


def test_no_aten_matrix_product_in_the_source(tmp_path):
    """common's source check, on a copy where this stage's own op, ops.linear(...), is renamed:
    it is the one `linear(` call allowed (common/tests shows the check finds stage 04's calls)."""
    (tmp_path / "src").mkdir()
    for path in (STAGE / "src").iterdir():
        if path.suffix in (".cpp", ".h", ".py"):
            text = re.sub(r"\bops\.linear\(", "ops.eml_linear(", path.read_text())
            (tmp_path / "src" / path.name).write_text(text)
    assert_no_matrix_product(tmp_path)


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_the_built_module_calls_no_aten_matrix_product():
    """Judged on the built module, whatever the source spells: on the stable ABI an ATen operator
    is called by its name (an "aten::<name>" string in _C's bytes) or through a shim function
    (an undefined aoti_torch_* symbol); neither names a matrix product."""
    path = pathlib.Path(_C.__file__)
    called = {name.decode() for name in re.findall(rb"aten::(\w+)", path.read_bytes())}
    assert called, "no aten:: name found in _C: the check would see nothing"
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True,
                               check=True).stdout.split()
    shims = [name for name in undefined if name.startswith("aoti_torch_")]
    assert not called & MATRIX_PRODUCT_OPS, f"_C calls ATen matrix products: {sorted(called & MATRIX_PRODUCT_OPS)}"
    shim_products = [name for name in shims if re.search(r"_(" + "|".join(MATRIX_PRODUCT_OPS) + r")(_out)?$", name)]
    assert not shim_products, f"_C calls matrix products through the shim: {shim_products}"


# -- the stable ABI: no libtorch C++ symbol, no libtorch C++ header -----------------------------------
def test_imports_no_libtorch_cpp_symbol():
    """The proof that one binary outlives its torch: every libtorch function _C calls is a C
    function of the shim (aoti_torch_*, torch_*), whose names and signatures torch keeps."""
    assert_imports_no_libtorch_cpp_symbol(_C.__file__)  # common/tests: the check finds stage 08's


def test_no_libtorch_cpp_header_in_the_source():
    """Only torch/csrc/stable and torch/headeronly; setup.py's TORCH_TARGET_VERSION and
    TORCH_STABLE_ONLY make the compiler refuse the rest too, this check names the line."""
    allowed = re.compile(r"#include <torch/(csrc/stable|headeronly)/")
    found = [f"{path.name}: {line.strip()}" for path in sorted((STAGE / "src").glob("*.[ch]*"))
             for line in path.read_text().splitlines()
             if re.match(r"\s*#include <(ATen|c10|torch)/", line) and not allowed.match(line.strip())]
    assert not found, found
    # The flag itself, in the compiler's arguments (setup.py's comments name it too).
    setup_code = "\n".join(line.split("#")[0] for line in (STAGE / "setup.py").read_text().splitlines())
    compile_args = re.search(r"extra_compile_args=\[([^\]]*)\]", setup_code)
    assert compile_args and '"-DTORCH_STABLE_ONLY"' in compile_args.group(1), compile_args


# -- loading by path, in a fresh process ----------------------------------------------------------------
LOAD_BY_PATH = """
import sys, warnings, torch, torch.nn.functional as F
{before}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.ops.load_library({path!r})
print("warnings:", [str(w.message) for w in caught])
print("ops.py imported:", "eml.linear_stable.ops" in sys.modules)
print("pystub:", torch._C._dispatch_pystub("eml_stable::linear", ""))
{after}
"""

CHECK_PYTHON_HALVES = """
x, w, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((5, 7), (3, 7), (3,)))
op = torch.ops.eml_stable.linear.default
assert torch.autograd.gradcheck(op, (x, w, b)), "autograd"
f = torch.compile(lambda x, w, b: op(x, w, b), fullgraph=True, backend="eager")
torch.testing.assert_close(f(x, w, b), F.linear(x, w, b))
with torch.autocast("cpu"):
    assert op(x.float(), w.float(), None).dtype == torch.bfloat16, "autocast"
print("python halves: ok")
"""


def run_fresh(code, *options):
    result = subprocess.run([sys.executable, *options, "-c", code], capture_output=True, text=True, timeout=600, cwd="/")
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_loaded_by_path_gets_its_python_halves(tmp_path):
    """torch.ops.load_library(path) alone, no import of the package, on a copy of the file (so
    that ops.py's own `from . import _C` would load a second library, were it not skipped): the
    fake kernel (compile), autograd and autocast work, and set_python_module recorded where they
    live, under the name ops.py really has."""
    copy = tmp_path / "_C.abi3.so"
    shutil.copy(_C.__file__, copy)
    out = run_fresh(LOAD_BY_PATH.format(before="", path=str(copy), after=CHECK_PYTHON_HALVES)).stdout
    assert "warnings: []" in out and "ops.py imported: True" in out, out
    assert f"pystub: ('{ops_module.__name__}', '')" in out, out
    assert "python halves: ok" in out, out


NOT_INSTALLED = 'sys.modules["eml.linear_stable"] = None  # as if the package were not installed'
CPU_KERNEL = 'print(torch.ops.eml_stable.linear(torch.ones(2, 3), torch.ones(4, 3), None).sum().item())'
MISSING = r"linear_stable: loaded by path, but the Python module eml\.linear_stable\.ops could not be imported \(.+\): .*no fake kernel, autograd"


def test_loaded_by_path_without_its_python_module_says_what_is_missing():
    """If ops.py cannot be imported, the load still succeeds, with a warning that names what is
    missing and why (the import's own error)."""
    out = run_fresh(LOAD_BY_PATH.format(before=NOT_INSTALLED, path=_C.__file__, after=CPU_KERNEL)).stdout
    assert "ops.py imported: False" in out, out
    assert re.search(MISSING, out) and "'eml.linear_stable' is not a package" in out, out  # the cause
    assert out.strip().endswith("24.0"), "the CPU kernel itself works"


def test_loaded_by_path_under_warnings_as_errors():
    """python -W error: the warning would be an exception inside dlopen; it goes to stderr instead."""
    code = f"import sys, torch\n{NOT_INSTALLED}\ntorch.ops.load_library({_C.__file__!r})\n{CPU_KERNEL}"
    result = run_fresh(code, "-W", "error::RuntimeWarning")
    assert re.search(MISSING, result.stderr), result.stderr
    assert result.stdout.strip() == "24.0"


def test_a_second_copy_of_the_library_is_not_registered_silently(tmp_path):
    """The ops can be registered once per process. Loading a second copy of the file after the
    package is one registration too many, which torch must refuse: torch 2.13's StableLibrary
    ignores the error code of its C shim call and the process crashes (README, "Loading by path":
    load one copy only). This test holds the line that it does not go on as if nothing happened."""
    copy = tmp_path / "_C.abi3.so"
    shutil.copy(_C.__file__, copy)
    code = (f"import torch, eml.linear_stable\nprint('imported', flush=True)\n"
            f"torch.ops.load_library({str(copy)!r})\nprint('registered twice')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    # the package imported (the first registration), and the process went no further than the second
    assert result.stdout.splitlines()[:1] == ["imported"], (result.returncode, result.stdout, result.stderr[-2000:])
    assert result.returncode != 0 and "registered twice" not in result.stdout, (result.returncode, result.stdout)


# -- 08 and 16 side by side -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_same_results_as_stage_08_bit_for_bit(dtype):
    """The same kernels and loop nest: every product equal to stage 08's, bit for bit."""
    stage08 = pytest.importorskip("eml.linear_op.ops", reason="stage 08 is not installed")
    for case in [Case((37,), 61, 53), Case((2, 65), 129, 257), Case((1,), 1, 1)]:
        input, weight, bias, grad_output = (t.to(dtype) for t in tensors(case, torch.float64))
        for got, want in zip(everything(ops_module, input, weight, bias, grad_output),
                             everything(stage08, input, weight, bias, grad_output)):
            assert torch.equal(got, want), case
    # non-contiguous operands (the copy each stage makes), and one gradient at a time
    input, weight, bias, grad_output = (t.to(dtype) for t in tensors(Case((9, 2), 33, 17), torch.float64))
    input_t, weight_t = input.transpose(0, 1), weight.t().contiguous().t()  # (2, 9, 33), strided
    assert not input_t.is_contiguous() and not weight_t.is_contiguous()
    assert torch.equal(ops_module.forward(input_t, weight_t, bias), stage08.forward(input_t, weight_t, bias))
    gy = grad_output.transpose(0, 1)
    for needs in [(True, False, False), (False, True, False), (False, False, True)]:
        for got, want in zip(ops_module.backward(gy, input_t, weight_t, *needs), stage08.backward(gy, input_t, weight_t, *needs)):
            assert (got is None and want is None) or torch.equal(got, want), needs


# -- the wheel: abi3, installed into a fresh venv, smoke-tested there (SLOW: one wheel build) ------
def test_abi3_wheel_installs_into_a_fresh_venv(tmp_path):
    """`pip wheel --no-build-isolation --no-deps` builds the wheel (in the stage's own build/
    folder, so under `make test`, after `make`, ninja recompiles nothing; run alone, without make's
    CFLAGS, it compiles again); the wheel is installed into a fresh venv,
    which is then lent this environment's torch and numpy through a .pth file written after the
    install (a fresh venv has no torch, and downloading one is not the point), and a smoke test
    runs there against F.linear."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(wheels),
                    str(STAGE)], check=True, timeout=1200, env=dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}"))
    (wheel,) = wheels.glob("*.whl")
    assert re.fullmatch(r"eml_linear_stable-0\.1\.0-cp310-abi3-linux_x86_64\.whl", wheel.name), wheel.name

    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # Install first (pip sees an empty venv, nothing "already satisfied"), then lend it torch.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, timeout=300)
    assert pathlib.Path(site, "eml", "linear_stable", "_C.abi3.so").is_file()
    torch_site = pathlib.Path(torch.__file__).parents[1]
    pathlib.Path(site, "torch_from_the_tutorial_env.pth").write_text(f"{torch_site}\n")  # searched after site itself
    smoke = (
        "import torch, torch.nn.functional as F, eml.linear_stable as m\n"
        f"assert m.__file__.startswith({site!r}), m.__file__\n"
        "x, w, b = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3)\n"
        "torch.testing.assert_close(torch.ops.eml_stable.linear(x, w, b), F.linear(x, w, b))\n"
        "print('smoke ok', m._C.__file__.rsplit('/', 1)[-1])\n"
    )
    result = subprocess.run([python, "-c", smoke], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "smoke ok _C.abi3.so"
