"""Stage 17's tests: stage 11's (the recurrent-cell contract of common/ for the module and the
Function, on awkward shapes in float32 and float64, one answer on 1 and 2 threads; the compiled
module called directly; the SSE2 and AVX2 copies; what the Function saves; one OpenMP runtime;
both build routes), and what is new: the GEMMs against ATen's on awkward shapes and with
strided inputs, no ATen matrix product left in the source, LIBXSMM kept inside the module."""

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import threading

import pytest
import torch

from eml.common.cpp_checks import assert_dispatches_no_matrix_product, assert_no_matrix_product
from eml.common.lltm_checks import (CellTests, Shape, assert_all_close, make_arguments, module_as_function,
                                    outputs_and_grads, reference_lltm)
from eml.lltm_xsmm import LLTM, LLTMFunction, _C, jit


class TestCell(CellTests):
    make_cell = staticmethod(LLTM)
    function = staticmethod(LLTMFunction.apply)
    prefix = "lltm_xsmm"
    double_backward = False  # the backward uses gates forward saved unrecorded: once differentiable


def test_forward_returns_h_cell_and_the_gates():
    input, weights, bias, old_h, old_cell = make_arguments(Shape(4, 6, 5), torch.float64)
    new_h, new_cell, gates = _C.forward(input, weights, bias, old_h, old_cell)
    assert [tuple(t.shape) for t in (new_h, new_cell, gates)] == [(4, 5), (4, 5), (4, 15)]
    torch.testing.assert_close(gates, torch.cat([old_h, input], 1) @ weights.t() + bias)
    expected = reference_lltm(input, weights, bias, old_h, old_cell)
    torch.testing.assert_close(new_h, expected[0])
    torch.testing.assert_close(new_cell, expected[1])


def test_forward_pass_alone_is_the_forward_after_its_gemm():
    arguments = make_arguments(Shape(5, 7, 13), torch.float32)
    new_h, new_cell, gates = _C.forward(*arguments)
    alone = _C.forward_pass(gates, arguments[4])
    torch.testing.assert_close(alone[0], new_h, rtol=0, atol=0)
    torch.testing.assert_close(alone[1], new_cell, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=r"gates must be a contiguous \(B, 3S\) tensor for old_cell \(B, S\), "
                                           r"got gates \[5, 39\] and old_cell \[5, 12\]"):
        _C.forward_pass(gates, torch.zeros(5, 12))


def test_backward_splits_d_x_at_the_state_size_when_f_differs_from_s():
    # F = 9, S = 4: split(S, dim=1) would give d_old_h 4 columns and d_input only 4 of its 9.
    arguments = make_arguments(Shape(3, 9, 4), torch.float64)
    input, weights, bias, old_h, old_cell = arguments
    new_h, new_cell, gates = _C.forward(*arguments)
    grad_h, grad_cell = torch.ones_like(new_h), torch.zeros_like(new_cell)
    d_old_h, d_input, d_weights, d_bias, d_old_cell = _C.backward(grad_h, grad_cell, new_cell, gates, input, old_h,
                                                                  weights, True, True)
    assert d_old_h.shape == (3, 4) and d_input.shape == (3, 9) and d_bias.shape == (1, 12)
    leaves = [a.detach().requires_grad_() for a in arguments]
    reference_lltm(*leaves)[0].sum().backward()
    torch.testing.assert_close(d_input, leaves[0].grad)
    torch.testing.assert_close(d_old_h, leaves[3].grad)
    torch.testing.assert_close(d_weights, leaves[1].grad)


@pytest.mark.parametrize("shape", [Shape(3, 5, 7), Shape(16, 32, 128)], ids=str)
def test_d_bias_is_the_same_with_or_without_d_weights(shape, two_threads):
    # With d_weights, each of its threads sums its columns of d_gates (16 x 32 x 128: two threads);
    # without, one ATen sum. Both against the reference's bias gradient.
    arguments = make_arguments(shape, torch.float64)
    input, weights, bias, old_h, old_cell = arguments
    new_h, new_cell, gates = _C.forward(*arguments)
    grad_h, grad_cell = torch.cos(new_h), torch.sin(new_cell)
    with_weights = _C.backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights, False, True)[3]
    without = _C.backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights, False, False)[3]
    leaves = [a.detach().requires_grad_() for a in arguments]
    torch.autograd.backward(reference_lltm(*leaves), [grad_h, grad_cell])
    torch.testing.assert_close(with_weights, leaves[2].grad.reshape(1, -1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(without, leaves[2].grad.reshape(1, -1), rtol=1e-10, atol=1e-12)


def test_backward_skips_the_gemms_nobody_asked_for():
    input, weights, bias, old_h, old_cell = make_arguments(Shape(3, 5, 7), torch.float64)
    new_h, new_cell, gates = _C.forward(input, weights, bias, old_h, old_cell)
    results = _C.backward(new_h, new_cell, new_cell, gates, input, old_h, weights, False, False)
    assert [r is None for r in results] == [True, True, True, False, False]


def forward_and_backward(arguments):
    """new_h, new_cell and the five gradients of the cell at these arguments, from _C directly."""
    new_h, new_cell, gates = _C.forward(*arguments)
    input, weights, bias, old_h, old_cell = arguments
    grad_h, grad_cell = torch.cos(new_h), torch.sin(new_cell)  # not all ones: every term counts
    return [new_h, new_cell, *_C.backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights, True, True)]


@pytest.mark.parametrize("shape", [Shape(1, 3, 1), Shape(5, 7, 13), Shape(16, 32, 128), Shape(3, 9, 37),
                                   Shape(11, 13, 21)], ids=str)
def test_the_sse2_and_avx2_copies_compute_the_same_cell(shape):
    # S = 1, 13, 37: the 8-wide copy's remainder loop runs; 128: only full vectors. X's transpose
    # (8 x 8 tiles on AVX2, libxsmm_otrans on "sse2"): B = 11 leaves 3 rows after a block of 8, and
    # old_h's 21 and the input's 13 columns leave 5 each after their tiles.
    if _C.simd_path() != "avx2+fma":
        pytest.skip(f"this CPU runs the '{_C.simd_path()}' copy only: there is no second copy to compare")
    arguments = make_arguments(shape, torch.float32)
    try:
        _C.set_simd_path("sse2")
        portable = forward_and_backward(arguments)
    finally:
        _C.set_simd_path("avx2+fma")
    for name, a, b in zip(["new_h", "new_cell", "d_old_h", "d_input", "d_weights", "d_bias", "d_old_cell"],
                          portable, forward_and_backward(arguments)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_an_unknown_simd_path_is_refused_by_name():
    with pytest.raises(RuntimeError, match="must be 'sse2' or 'avx2\\+fma', got 'avx512'"):
        _C.set_simd_path("avx512")


def saved_bytes(function, arguments):
    """Bytes of the tensors the Function saves for the backward that are not its inputs or outputs."""
    known, extra = set(), {}

    def pack(tensor):
        extra[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    leaves = [a.detach().requires_grad_() for a in arguments]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outputs = function(*leaves)
    known = {t.untyped_storage().data_ptr() for t in (*leaves, *outputs)}
    return sum(size for pointer, size in extra.items() if pointer not in known)


def test_saves_only_the_gates_for_the_backward():
    shape = Shape(64, 1024, 128)
    arguments = make_arguments(shape, torch.float32)
    assert saved_bytes(LLTMFunction.apply, arguments) == shape.batch * 3 * shape.state * 4


def test_the_module_saves_only_the_gates_too():
    """What the module runs, _C.cell (the C++ autograd node), keeps what LLTMFunction keeps."""
    from eml.common import lltm_bench
    shape = Shape(64, 1024, 128)
    assert lltm_bench.saved_bytes(LLTM, (shape.batch, shape.features, shape.state)) == shape.batch * 3 * shape.state * 4


def test_one_openmp_runtime_in_the_process():
    with open("/proc/self/maps") as maps:
        runtimes = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
    assert len(runtimes) <= 1, f"more than one OpenMP runtime loaded: {sorted(runtimes)}"
    # The cause, not only the symptom: torch's wheel ships libgomp.so.1 under its plain soname, so
    # a module linked with -fopenmp would share it here and pass the check above; it must name no
    # OpenMP library of its own (-fopenmp on the compile line only).
    assert b"libgomp" not in pathlib.Path(_C.__file__).read_bytes(), "_C is linked against a libgomp"


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
    assert _C.__name__ == "eml.lltm_xsmm._C" and _C.__file__.endswith(".so")


# ---- New in 17: the GEMMs on LIBXSMM ----

@pytest.fixture
def two_threads():
    """Two threads whatever the machine has, so that the splits among threads happen on one core too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("shape", [Shape(1, 1, 1), Shape(3, 5, 31), Shape(7, 13, 33), Shape(5, 17, 9), Shape(64, 1024, 128),
                                   Shape(2, 3, 257), Shape(5, 200, 70), Shape(4, 6, 0), Shape(64, 100, 700)], ids=str)
def test_the_gemms_match_atens(shape, dtype, two_threads):
    """gates against ATen's addmm on the same operands; the outputs and five gradients of the
    Function against the reference cell (common's helpers), on 2 threads, at shapes that include
    the benchmark's large one (every GEMM split among the threads, and X's transposed copy: the
    first thread's columns run from old_h into the input) and a 1-row one. B64xF100xS700 splits
    X's 800 columns at 400: the second thread's run from the middle of old_h into the input."""
    input, weights, bias, old_h, old_cell = make_arguments(shape, dtype)
    X = torch.cat([old_h, input], dim=1)
    _, _, gates = _C.forward(input, weights, bias, old_h, old_cell)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gates, torch.addmm(bias.reshape(1, -1), X, weights.t()), **tolerance)
    arguments = [input, weights, bias, old_h, old_cell]
    assert_all_close(outputs_and_grads(LLTMFunction.apply, arguments), outputs_and_grads(reference_lltm, arguments), dtype)


@pytest.mark.parametrize("blocks", [(0, 0), (1, 1), (7, 5), (64, 0), (0, 64)], ids=str)
@pytest.mark.parametrize("shape", [Shape(1, 1, 1), Shape(5, 200, 70), Shape(3, 9, 37), Shape(4, 6, 0)], ids=str)
def test_any_block_sizes_give_the_same_products(shape, blocks):
    """The GEMMs' blocks (section 3c) in the depth and over rows: none (one kernel per thread, as
    breakdown.py times it), 1, sizes that leave remainders (B3xF9xS37: k = 46, 9 and 37 rows),
    and one without the other, against the default blocks, in float64: forward and every gradient."""
    arguments = make_arguments(shape, torch.float64)
    want = outputs_and_grads(LLTMFunction.apply, arguments)
    default = _C.block_sizes()
    try:
        _C.set_block_sizes(*blocks)
        got = outputs_and_grads(LLTMFunction.apply, arguments)
    finally:
        _C.set_block_sizes(*default)
    assert default == (64, 64)
    assert_all_close(got, want, torch.float64)


def test_a_negative_block_size_is_refused_by_name():
    with pytest.raises(RuntimeError, match="block sizes must be >= 0 .*got depth 64 and rows -1"):
        _C.set_block_sizes(64, -1)
    assert _C.block_sizes() == (64, 64)


def test_scratch_memory_kept_from_a_larger_shape_gives_a_smaller_the_right_answer():
    """The copies of section 3c live in scratch memory each thread keeps between calls: after a
    large shape, a smaller one finds buffers larger than it needs, full of the large one's numbers;
    then a larger one again makes them grow. Every call against the reference, in float64."""
    for shape in (Shape(64, 100, 700), Shape(3, 5, 31), Shape(1, 1, 1), Shape(17, 40, 90)):
        arguments = make_arguments(shape, torch.float64)
        assert_all_close(outputs_and_grads(LLTMFunction.apply, arguments),
                         outputs_and_grads(reference_lltm, arguments), torch.float64)


def test_two_python_threads_each_keep_their_own_scratch_memory():
    """Two Python threads step cells of different shapes at once: a forward holds the GIL, but a
    backward runs in autograd's engine without it, so it overlaps the other thread's forward or
    backward, both of which use scratch memory. Each thread's buffers must be its own."""
    cases = []
    for shape in (Shape(16, 200, 70), Shape(9, 13, 150)):
        arguments = make_arguments(shape, torch.float64)
        cell = module_as_function(LLTM(shape.features, shape.state, dtype=torch.float64))  # _C.cell's node
        cases.append((cell, arguments, outputs_and_grads(reference_lltm, arguments)))
    failures = []

    def steps(cell, arguments, want):
        try:
            for _ in range(30):
                assert_all_close(outputs_and_grads(cell, arguments), want, torch.float64)
        except AssertionError as error:
            failures.append(error)

    workers = [threading.Thread(target=steps, args=case) for case in cases]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, failures[0]


def test_the_gemms_read_strided_operands():
    """Non-contiguous input, state and weights: the module copies them once, as ATen would."""
    input, weights, bias, old_h, old_cell = make_arguments(Shape(6, 11, 7), torch.float64)
    strided = [input.t().contiguous().t(), weights.t().contiguous().t(), bias, old_h.t().contiguous().t(), old_cell]
    assert not strided[0].is_contiguous() and not strided[1].is_contiguous()
    for got, want in zip(_C.forward(*strided), _C.forward(input, weights, bias, old_h, old_cell)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_no_aten_matrix_product_in_the_source():
    """common's source check: no addmm, mm, matmul, linear or BLAS call left in lltm.cpp or lltm.py."""
    assert_no_matrix_product(pathlib.Path(__file__).resolve().parents[1])


def test_no_aten_matrix_product_runs():
    """What a module step dispatches, every gradient asked for, single- and multi-threaded sizes
    (stage 11 runs at::addmm and at::mm here; common/tests shows the check sees such calls)."""
    for shape in (Shape(3, 5, 7), Shape(16, 32, 128)):
        cell = LLTM(shape.features, shape.state).double()
        input, _, _, old_h, old_cell = make_arguments(shape, torch.float64)
        for tensor in (input, old_h, old_cell):
            tensor.requires_grad_()

        def step():
            new_h, new_cell = cell(input, (old_h, old_cell))
            (new_h.sum() + new_cell.sum()).backward()

        assert_dispatches_no_matrix_product(step)


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_libxsmm_stays_inside_the_module():
    symbols = subprocess.run(["nm", "-D", "--defined-only", _C.__file__], capture_output=True, text=True, check=True).stdout
    leaked = [line.split()[-1] for line in symbols.splitlines() if re.search(r"\b(libxsmm_\w+|[sd]gemm_?)$", line)]
    assert not leaked, f"_C exports LIBXSMM symbols: {leaked[:5]}"


def _breakdown_script():
    """17's breakdown.py as a module (it is a script beside the package, not part of it)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "breakdown.py"
    spec = importlib.util.spec_from_file_location("breakdown_17", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def saved_build(tmp_path):
    """(breakdown.py as a module, a copy of the module's file loaded by it), as --against does."""
    script, copy = _breakdown_script(), tmp_path / "_C_before.so"
    shutil.copy(_C.__file__, copy)
    return script, script.load_other_build(str(copy))


def test_breakdown_loads_another_build_beside_this_one(saved_build, tmp_path):
    """breakdown.py --against: a copy of the module's file, imported beside eml.lltm_xsmm._C, is a
    second module (its own block sizes) that computes the same cell."""
    _, before = saved_build
    assert before is not _C and before.__file__ == str(tmp_path / "_C_before.so")
    arguments = make_arguments(Shape(5, 7, 13), torch.float64)
    for got, want in zip(before.forward(*arguments), _C.forward(*arguments)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    blocks = _C.block_sizes()
    before.set_block_sizes(0, 0)
    assert before.block_sizes() == (0, 0) and _C.block_sizes() == blocks


def test_breakdown_runs_every_row_once(saved_build):
    """Every statement breakdown.py would time, stage 11's and the other build's rows included,
    runs once on a small shape (a typo in a row fails here, not after minutes of timing), and the
    other build's rows follow the rows they compare with."""
    script, before = saved_build
    rows, env = script.rows_and_env((3, 5, 7), before=before)
    for statement in rows.values():
        exec(statement, dict(env))
    labels = list(rows)
    assert labels[labels.index("C++ forward (_C.forward)") + 1] == "C++ forward (before)"
    assert labels[labels.index("C++ backward (_C.backward)") + 1] == "C++ backward (before)"
    assert labels[-2:] == ["forward + backward, _C.cell alone",
                           "forward + backward, _C.cell alone (before)"]
    alone, _ = script.rows_and_env((3, 5, 7))
    assert not [label for label in alone if "before" in label or "_C.cell alone" in label]


def test_breakdown_names_a_file_it_cannot_load(tmp_path):
    load = _breakdown_script().load_other_build
    with pytest.raises(SystemExit, match=r"--against .*missing\.so: no such file"):
        load(str(tmp_path / "missing.so"))
    text = tmp_path / "notes.txt"
    text.write_text("not a module")
    with pytest.raises(SystemExit, match=r"--against .*notes\.txt: not a Python extension module's file"):
        load(str(text))
    fake = tmp_path / "_C.so"
    fake.write_text("not a shared library")
    with pytest.raises(SystemExit, match=r"--against .*_C\.so: not a Python extension module's file"):
        load(str(fake))
    stage11 = pytest.importorskip("eml.lltm_fused._C", reason="stage 11 not installed")
    with pytest.raises(SystemExit, match=r"--against .*: not a build of stage 17's module"):
        load(stage11.__file__)


def test_breakdown_refuses_fewer_than_one_round(capsys):
    with pytest.raises(SystemExit) as refusal:
        _breakdown_script().main(["--rounds", "0"])
    assert refusal.value.code == 2 and "--rounds must be at least 1, got 0" in capsys.readouterr().err


def test_breakdown_times_the_rounds_it_is_given(monkeypatch, capsys):
    script = _breakdown_script()
    asked = []

    def fake_breakdown(shape, threads, before=None, rounds=3):
        asked.append(rounds)
        rows, _ = script.rows_and_env(shape, before)
        return {label: 1.0 for label in rows}

    monkeypatch.setattr(script, "breakdown", fake_breakdown)
    script.main(["--rounds", "5"])
    assert asked == [5] * len(script.SHAPES) and ", 5 rounds;" in capsys.readouterr().out


def test_breakdown_splits_the_step_into_passes_floor_and_the_rest(monkeypatch, capsys):
    """The printed account adds up: the module's step = the two C++ passes + what is beyond them,
    and = the C++ floor + the passes + what they cost more after a step + the node's rest."""
    script = _breakdown_script()
    timed = {"C++ forward (_C.forward)": 30.0, "C++ backward (_C.backward)": 20.0,
             "module forward + backward, _C.cell": 200.0, "the same through Python's LLTMFunction": 230.0,
             "the C++ floor (floor_cell: computes nothing)": 120.0,
             "floor_cell's step, then the two C++ passes": 175.0}

    def fake_breakdown(shape, threads, before=None, rounds=3):
        rows, _ = script.rows_and_env(shape, before)
        assert set(timed) <= set(rows)
        return {label: timed.get(label, 1.0) for label in rows}

    monkeypatch.setattr(script, "breakdown", fake_breakdown)
    script.main([])
    lines = capsys.readouterr().out.splitlines()
    n = len(script.SHAPES)

    def printed(label):
        return [float(line.split()[-1]) for line in lines if line.strip().startswith(label)]

    assert printed("beyond the two C++ passes, _C.cell") == [150.0] * n
    assert printed("beyond the two C++ passes, LLTMFunction") == [180.0] * n
    parts = [printed(label) for label in ("the C++ floor's step", "+ the two C++ passes, called alone",
                                          "+ their extra cost right after a floor step",
                                          "+ the rest (the node beyond the floor; noise)")]
    assert parts == [[120.0] * n, [50.0] * n, [5.0] * n, [25.0] * n]
    assert [sum(shape_parts) for shape_parts in zip(*parts)] == [200.0] * n  # the module's step


# ---- The benchmark's floor for a C++ node ----

def test_the_cpp_floor_node_computes_nothing_but_has_the_cells_shapes_and_gradients():
    """_C.nothing_cell: the cell's outputs and the parameters' gradients, allocated in their shapes,
    nothing saved; the stage's TOUR hands it to the LLTM benchmark's --floor."""
    from eml.common import lltm_bench
    from eml.lltm_xsmm import TOUR, floor_cell
    features, state = 3, 4
    cell = floor_cell(features, state)
    assert {name: p.shape for name, p in cell.named_parameters()} == \
        {name: p.shape for name, p in LLTM(features, state).named_parameters()}
    input, old_h, old_cell = torch.randn(2, features), torch.randn(2, state), torch.randn(2, state)
    new_h, new_cell = cell(input, (old_h, old_cell))
    assert new_h.shape == old_h.shape and new_cell.shape == old_cell.shape
    assert new_h.grad_fn.name() == "torch::autograd::CppNode<NothingComputed>"
    torch.autograd.backward([new_h, new_cell], [torch.ones_like(new_h), torch.ones_like(new_cell)])
    assert cell.weights.grad.shape == cell.weights.shape and cell.bias.grad.shape == cell.bias.shape
    assert lltm_bench.saved_bytes(floor_cell, (2, features, state)) == 0
    assert TOUR["floors"] == {"floor, C++ node (computes nothing)": floor_cell}
    assert lltm_bench.discover_cells(key="floors")["floor, C++ node (computes nothing)"] is floor_cell
