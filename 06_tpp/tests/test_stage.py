"""Stage 06's tests: the shared contracts (common/) for the Layer and the Function, also with tiny
blocks that make every tail kernel run, and what is new in this stage: the LinearState (kernels
dispatched at construction and lazily, lifetime, flat memory), the pack cache (reused while the
weight is unchanged, never stale after a change PyTorch can see), a NULL kernel as a clear
error, a missing LIBXSMM as a clear build error, the peak probe and the tour entry, one OpenMP
runtime and bitwise the same answer on 1 and 2 threads. Plus stage 05's checks of the C++
functions themselves: the course's two declarations, only the requested gradients computed,
every message from check_inputs, no ATen matrix product anywhere in the source."""

import copy
import gc
import importlib.metadata
import io
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from eml.common.checks import CASES, Case, FunctionTests, LayerTests, assert_close, expect_error
from eml.common.cpp_checks import (
    AWKWARD, CppModuleTests, assert_exports_no_symbol_of, assert_no_matrix_product, assert_results_close, everything,
    expected_grads, tensors,
)
from eml.common.cpp_checks import assert_dispatches_no_matrix_product, assert_matches_torch_in_turns_and_on_two_threads
from eml.linear_tpp import TOUR, Function, Layer, _C, peak_gflops

STAGE = pathlib.Path(__file__).resolve().parents[1]  # 06_tpp/, as shipped in the repository

# Blocks of 2 to 5 so that even the tests' small shapes have a tail in m, n and k for every
# product (13 = 4*3 + 1, 7 = 3*2 + 1, ...): all 16 kernel variants of each product run.
TINY_BLOCKS = dict(forward=[3, 2, 5], grad_input=[2, 3, 4], grad_weight=[5, 3, 2])


def tiny_block_layer(*args, **kwargs):
    """A Layer (any of its arguments) whose state has tiny blocks, forward tiles column-first."""
    layer = Layer(*args, **kwargs)
    layer.state.set_config(**TINY_BLOCKS, n_outer=[True, False, False])
    return layer


class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)
    double_backward = False  # once differentiable, the contract of the pybind11 C++ stages (04's README: why)


class TestLayerTinyBlocks(TestLayer):
    """The whole contract again with tiny blocks: every tail kernel, both tile orders."""

    make_layer = staticmethod(tiny_block_layer)


class TestFunction(FunctionTests):
    # A fresh state per call, sized from the weight as a Layer would size it. weight.shape[-1]
    # (not [1]) so that a 1-d weight still reaches C++, whose check_inputs must name the problem.
    linear = staticmethod(
        lambda input, weight, bias: Function.apply(input, weight, bias, _C.LinearState(weight.shape[-1], weight.shape[0]))
    )
    double_backward = False


class TestFunctionTemporaryState(TestFunction):
    linear = staticmethod(Function.apply)  # state None: C++ makes a temporary one per call


class TestModule(CppModuleTests):
    """The compiled module's contract (common/), with a LinearState per call as a Layer has."""

    prefix = "linear_tpp"
    module = _C
    bitwise_across_threads = True  # each tile: one thread, the same kernels in the same order

    def state(self, in_features, out_features):
        return _C.LinearState(in_features, out_features)

    def forward(self, input, weight, bias):
        # weight.shape[-1]: a malformed weight still reaches C++, whose check_inputs names it
        return _C.forward(input, weight, bias, self.state(weight.shape[-1], weight.shape[0]))

    def backward(self, grad_output, input, weight, need_input, need_weight, need_bias):
        sized_by = input if input is not None else weight  # None when only grad_bias is asked for
        state = None if sized_by is None else self.state(sized_by.shape[-1], grad_output.shape[-1])
        return _C.backward(grad_output, input, weight, need_input, need_weight, need_bias, state)

    def apply(self, input, weight, bias):
        state = _C.LinearState(weight.shape[1], weight.shape[0])
        return Function.apply(input, weight, bias, state), (state,)  # the Layer's state reaches C++


class TestModuleTemporaryState(TestModule):
    """state=None: C++ makes a temporary LinearState for the call."""

    def state(self, in_features, out_features):
        return None


def check_everything(case, dtype, state, bias=True):
    """output and the three gradients, straight from the extension with one state, against torch."""
    input, weight, bias_tensor, grad_output = tensors(case, dtype)
    bias_tensor = bias_tensor if bias else None
    want = [F.linear(input, weight, bias_tensor), *expected_grads(input, weight, grad_output)]
    assert_results_close(everything(_C, input, weight, bias_tensor, grad_output, state), want, case, dtype)


def test_bias_overload_adds_the_bias():
    input, weight, bias, _ = tensors(CASES[7])
    state = _C.LinearState(33, 65)
    assert_close(_C.forward(input, weight, bias, state), F.linear(input, weight, bias), torch.float64, "with bias")
    assert_close(_C.forward(input, weight, None, state), input @ weight.t(), torch.float64, "bias None")


# -- the kernels against torch on shapes that fit no block ---------------------------------
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", AWKWARD, ids=str)
def test_awkward_shapes_match_torch(case, dtype, bias):
    check_everything(case, dtype, _C.LinearState(case.in_features, case.out_features), bias)


@pytest.mark.parametrize("n_outer", [(False, False, False), (True, True, True)], ids=["rows-first", "columns-first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", [Case((7,), 11, 13), Case((61,), 129, 61), Case((1,), 13, 1), Case((2, 3), 5, 9)], ids=str)
def test_every_tail_kernel_runs(case, dtype, n_outer):
    state = _C.LinearState(case.in_features, case.out_features)
    state.set_config(**TINY_BLOCKS, n_outer=list(n_outer))
    assert state.config == ([3, 2, 5], [2, 3, 4], [5, 3, 2], list(n_outer))
    check_everything(case, dtype, state, bias=True)
    check_everything(case, dtype, state, bias=False)
    if case == Case((7,), 11, 13) and dtype == torch.float32:
        # m, n and k all have a tail in every product: 16 variants each (beta 0 and 1), all
        # distinct, plus the 2 the constructor dispatched for the default blocking (forward and
        # grad_input: one tile, one k step, beta 0).
        assert state.kernels == 2 + 3 * 16


@pytest.mark.parametrize("n_outer", [(False, False, False), (True, True, True)], ids=["rows-first", "columns-first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", [Case((300,), 601, 259), Case((2, 150), 513, 7)], ids=str)
def test_chunks_of_k_steps_add_up(case, dtype, n_outer):
    """B is packed in chunks of k steps of at most 256 KB; a 256 x 256 block is a chunk of its
    own, so every k step after the first adds its tile into C (and, in grad_weight, into the
    fused grad_bias): several chunks and a tail in every product."""
    state = _C.LinearState(case.in_features, case.out_features)
    state.set_config([7, 256, 256], [7, 256, 256], [7, 256, 256], n_outer=list(n_outer))
    check_everything(case, dtype, state, bias=True)
    check_everything(case, dtype, state, bias=False)


def test_set_config_refuses_bad_blocks():
    state = _C.LinearState(4, 3)
    expect_error(lambda: state.set_config([0, 2, 2], [2, 2, 2], [2, 2, 2], [False] * 3), r"^linear_tpp: ", r"forward", r"bm >= 1", r"\[0, 2, 2\]")
    expect_error(lambda: state.set_config([2, 2, 2], [2, 2, -1], [2, 2, 2], [False] * 3), r"^linear_tpp: ", r"grad_input", r"-1")
    expect_error(lambda: state.set_config([2, 2, 2], [2, 2, 2], [2, 2], [False] * 3), r"^linear_tpp: ", r"grad_weight")
    expect_error(lambda: state.set_config([2, 2, 2], [2, 2, 2], [2, 2, 2], [False]), r"^linear_tpp: ", r"n_outer", r"\b1\b")


# -- the state: kernels at construction and on demand, lifetime, memory -------------------
def test_constructor_dispatches_the_batch_independent_kernels():
    # Feature counts below every default block size (the blocking depends on the instruction set:
    # the smallest is AVX2's 64), so each product is one row block and one k step.
    bn = _C.LinearState(1, 1).config[0][1]  # the forward's column block: the batch's block
    n_in, n_out = 30, 6
    state = _C.LinearState(n_in, n_out)
    # float32 forward (6 x 30 blocks) and grad_input (30 x 6): one kernel each, beta 0,
    # dispatched before any batch size is known.
    assert state.kernels == 2 and state.plans == 2, repr(state)
    w, b = torch.randn(n_out, n_in), torch.randn(n_out)
    x = torch.randn(2 * bn, n_in)
    assert_close(_C.forward(x, w, b, state), F.linear(x, w, b), torch.float32, f"N = {2 * bn}")
    assert state.kernels == 2, "a batch of whole column blocks needs no new kernel"
    x_tail = torch.randn(2 * bn + 2, n_in)
    assert_close(_C.forward(x_tail, w, b, state), F.linear(x_tail, w, b), torch.float32, f"N = {2 * bn + 2}")
    assert state.kernels == 3, "the 2-column tail block needs a kernel of its own, dispatched lazily"
    _C.backward(torch.randn(2 * bn + 2, n_out), x_tail, w, True, True, True, state)
    assert state.kernels > 6, "grad_weight reduces over the batch: its kernels wait for N"
    before = state.kernels
    _C.forward(x_tail.double(), w.double(), None, state)
    assert state.kernels > before, "float64 kernels are dispatched at its first use"


def test_the_layer_holds_its_state():
    layer = Layer(5, 3)
    assert isinstance(layer.state, _C.LinearState)
    assert (layer.state.in_features, layer.state.out_features) == (5, 3)
    assert "in_features=5" in repr(layer.state) and layer.state.kernels > 0


def test_state_made_for_other_sizes_is_refused():
    x, w = torch.randn(4, 6), torch.randn(3, 6)
    state = _C.LinearState(5, 3)
    expect_error(lambda: _C.forward(x, w, None, state), r"^linear_tpp: ", r"LinearState", r"in_features=5", r"in_features=6")
    expect_error(lambda: _C.backward(torch.randn(4, 3), x, w, True, True, False, state), r"^linear_tpp: ", r"in_features=5")
    # check_inputs runs first: a bad weight is reported as such, not as a state mismatch.
    expect_error(lambda: _C.forward(x, torch.randn(3, 5), None, state), r"^linear_tpp: ", r"input features", r"\b6\b")
    expect_error(lambda: _C.LinearState(-1, 3), r"^linear_tpp: ", r"in_features", r"-1")


def test_state_is_freed_with_its_last_reference():
    gc.collect()
    alive = _C.live_states()
    layer = Layer(8, 4)
    assert _C.live_states() == alive + 1
    x = torch.randn(2, 8, requires_grad=True)
    y = layer(x)
    del layer  # the autograd graph still holds the state (ctx.state) for the backward
    gc.collect()
    assert _C.live_states() == alive + 1
    y.sum().backward()
    del y
    gc.collect()
    assert _C.live_states() == alive


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_packs_for_one_call_fit_in_turns_and_on_two_threads():
    assert_matches_torch_in_turns_and_on_two_threads(_C, lambda case: (_C.LinearState(case.in_features, case.out_features),))


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="/proc/self/statm is Linux's")
def test_thousands_of_layers_keep_memory_flat():
    """Constructor and destructor free what they allocate: plans, packed weights, the state."""
    x_small, x_big = torch.randn(70, 64), torch.randn(8, 512)

    def churn(count):
        for i in range(count):
            layer = Layer(64, 32 + i % 3)  # a few sizes: LIBXSMM shares the kernels, not the states
            if i % 10 == 0:
                layer(x_small).sum().backward()  # plans of all three products
            if i % 20 == 0:
                big = Layer(512, 512)
                with torch.no_grad():
                    big(x_big)  # a cached packed weight of 1 MB: a leak would show at once
            del layer

    churn(300)  # warm-up: LIBXSMM's registry and code pages, the allocator's pools
    gc.collect()
    before = resident_bytes()
    churn(3000)
    gc.collect()
    growth = resident_bytes() - before
    assert growth < 20 * 2**20, f"resident memory grew by {growth / 2**20:.1f} MB over 3000 layers"


def test_deepcopy_and_save_make_a_new_state():
    layer = tiny_block_layer(6, 4)
    twin = copy.deepcopy(layer)
    assert twin.state is not layer.state and twin.state.config == layer.state.config
    x = torch.randn(5, 6)
    assert_close(twin(x), layer(x), torch.float32, "deepcopy")
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.state.config == layer.state.config
    assert_close(loaded(x), layer(x), torch.float32, "torch.save / torch.load")


# -- the pack cache: reused while W is unchanged, never stale after a visible change ------
def inference(layer, x):
    with torch.no_grad():
        return layer(x)


def test_packed_weight_is_reused_in_inference():
    layer, x = Layer(65, 33), torch.randn(7, 65)
    for _ in range(3):
        assert_close(inference(layer, x), F.linear(x, layer.weight, layer.bias), torch.float32, "inference")
    assert layer.state.packs == 1
    assert layer.state.packed_bytes >= 33 * 65 * 4


def test_training_packs_every_call_and_keeps_no_copy():
    layer, x = Layer(65, 33), torch.randn(7, 65)
    inference(layer, x)
    assert layer.state.packed_bytes > 0
    for step in range(3):
        layer(x).sum().backward()  # a gradient is recorded for W: it may change after the step
        assert layer.state.packs == 2 + step
        assert layer.state.packed_bytes == 0, "the cached pack is dropped: the optimizer is about to change W"


def test_frozen_weight_is_packed_once():
    layer, x = Layer(12, 5), torch.randn(4, 12, requires_grad=True)
    layer.weight.requires_grad_(False)
    for _ in range(3):
        layer(x).sum().backward()
    assert layer.state.packs == 1


def test_visible_changes_repack():
    """In-place edit, optimizer step, load_state_dict, .to(): the next inference call sees them."""
    layer, x = Layer(20, 9), torch.randn(4, 20)
    inference(layer, x)

    def check(what):
        assert_close(inference(layer, x), F.linear(x, layer.weight, layer.bias), torch.float32, what)

    with torch.no_grad():
        layer.weight.mul_(-2.0)
    check("after an in-place edit")
    layer(x).sum().backward()
    torch.optim.SGD(layer.parameters(), lr=0.5).step()
    check("after an SGD step")
    layer.load_state_dict(torch.nn.Linear(20, 9).state_dict())
    check("after load_state_dict")
    layer.double()
    x = x.double()
    assert_close(inference(layer, x), F.linear(x, layer.weight, layer.bias), torch.float64, "after .double()")
    packs = layer.state.packs
    inference(layer, x)
    assert layer.state.packs == packs, "unchanged again: reused"


def test_training_with_evaluation_between_steps_matches_nn_linear():
    """The pattern a stale pack would break: evaluate (cached pack), train a step, evaluate again."""
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(20, 33), torch.nn.Tanh(), torch.nn.Linear(33, 5))
    model = torch.nn.Sequential(Layer(20, 33), torch.nn.Tanh(), Layer(33, 5))
    model.load_state_dict(reference.state_dict())
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.05) for m in (reference, model)]
    x, target = torch.randn(70, 20), torch.randn(70, 5)
    for step in range(5):
        for m, optimizer in zip((reference, model), optimizers):
            optimizer.zero_grad()
            F.mse_loss(m(x), target).backward()
            optimizer.step()
        with torch.inference_mode():
            assert_close(model(x), reference(x), torch.float32, f"evaluation after step {step}")
    with torch.no_grad():
        assert_close(model(x), reference(x), torch.float32, "no_grad evaluation")


def tensor_on(storage, shape):
    """A new tensor (own TensorImpl, own version counter) over an existing storage."""
    return torch.empty(0).set_(storage, 0, shape, (shape[1], 1))


def test_new_tensor_at_the_same_address_is_not_taken_for_the_old_one():
    """Same data pointer, shape, strides and version number: only the identity tells them apart."""
    storage = torch.randn(9 * 20).untyped_storage()
    state, x = _C.LinearState(20, 9), torch.randn(4, 20)
    old = tensor_on(storage, (9, 20))
    _C.forward(x, old, None, state, True)
    old_pointer, old_version = old.data_ptr(), old._version
    del old  # the cache holds only a weak reference: the old tensor is gone now
    writer = tensor_on(storage, (9, 20))
    with torch.no_grad():
        writer.mul_(3.0)  # new values in the same memory, through a tensor of its own
    del writer
    new = tensor_on(storage, (9, 20))
    assert (new.data_ptr(), new._version) == (old_pointer, old_version)
    assert_close(_C.forward(x, new, None, state, True), x @ new.t(), torch.float32, "new tensor, same address")
    assert state.packs == 2


def test_writes_behind_the_version_counter_need_invalidate():
    """The documented blind spot: .data and numpy views do not bump W's version counter."""
    layer, x = Layer(20, 9), torch.randn(4, 20)
    before = inference(layer, x)
    layer.weight.data.mul_(2.0)  # unseen by the version counter
    assert torch.equal(inference(layer, x), before), "a stale pack is the documented behaviour"
    layer.state.invalidate()
    assert_close(inference(layer, x), F.linear(x, layer.weight, layer.bias), torch.float32, "after invalidate()")


def test_non_contiguous_and_inference_weights():
    state, x = _C.LinearState(20, 9), torch.randn(4, 20)
    weight = torch.randn(20, 9).t()  # a transposed view: the cache keys on it, not on a copy
    for _ in range(2):
        assert_close(_C.forward(x, weight, None, state, True), x @ weight.t(), torch.float32, "transposed weight")
    assert state.packs == 1
    with torch.inference_mode():  # inference tensors have no version counter: packed every call
        weight = torch.randn(9, 20)
        for _ in range(2):
            assert_close(_C.forward(x, weight, None, state, True), x @ weight.t(), torch.float32, "inference tensor")
    assert state.packs == 3


@pytest.mark.parametrize("mode", ["training", "no_grad", "frozen"])
def test_layer_asks_for_the_cache_only_when_no_gradient_is_recorded_for_the_weight(mode, monkeypatch):
    seen = []
    real_forward = _C.forward
    monkeypatch.setattr(_C, "forward", lambda *args: seen.append(args[-1]) or real_forward(*args))
    layer, x = Layer(5, 3), torch.randn(2, 5)
    if mode == "frozen":
        layer.weight.requires_grad_(False)
    if mode == "no_grad":
        inference(layer, x)
    else:
        layer(x)
    assert seen == [mode != "training"]


# -- a NULL kernel: a Python exception that names the request ------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_null_kernel_is_a_clear_error(dtype):
    # LIBXSMM 1.17 generates no kernel for TRANS_A (hence the packed weight).
    message = expect_error(
        lambda: _C.dispatch_check(48, 32, 16, _C.FLAG_TRANS_A, dtype),
        r"^linear_tpp: ", r"NULL", r"m=48", r"n=32", r"k=16", r"lda=16", r"ldb=16", r"ldc=48", r"flags=1 \(TRANS_A\)",
        "float32" if dtype == torch.float32 else "float64",
    )
    # the version LIBXSMM reports, where the message names it (its fixed tail names 1.17 too)
    assert re.search(r"LIBXSMM \d+\.\d+\S* returned no kernel \(NULL\)", message)
    assert _C.dispatch_check(48, 32, 16, _C.FLAG_TRANS_B | _C.FLAG_BETA_0, dtype) is True  # and the process lives on


# -- a missing LIBXSMM: the build stops and names the package ------------------------------
def test_setup_without_libxsmm_names_the_package(tmp_path):
    shutil.copy(STAGE / "setup.py", tmp_path / "setup.py")
    empty = tmp_path / "include"
    empty.mkdir()
    env = dict(os.environ, LIBXSMM_INCLUDE_DIR=str(empty), PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "libxsmm-dev" in result.stderr and "sudo apt-get install -y libxsmm-dev" in result.stderr, result.stderr
    assert str(empty) in result.stderr, "the message says where it looked"
    assert not (tmp_path / "build").exists(), "it stopped before compiling"


# -- the peak probe and the tour ------------------------------------------------------------
def test_peak_probe_returns_a_positive_finite_number():
    peak = peak_gflops()
    assert isinstance(peak, float) and math.isfinite(peak) and peak > 0


def test_tour_registration():
    assert TOUR["layers"] == {"06 tpp": Layer}
    assert all(len(label) <= 22 for label in TOUR["layers"]), "the tour's table has 22 characters for a label"
    assert TOUR["peak_gflops"] is peak_gflops
    points = {point.name: point for point in importlib.metadata.entry_points(group="eml.tour")}
    assert points["06_tpp"].value == "eml.linear_tpp:TOUR"


def test_only_float_and_double_kernels_exist():
    # LIBXSMM's GEMMs are built for float and double only here.
    x, w = torch.randn(4, 6), torch.randn(3, 6)
    expect_error(lambda: _C.forward(x.half(), w.half()), r"^linear_tpp: ", r"dtype", r"Half")
    expect_error(lambda: _C.forward(x.bfloat16(), w.bfloat16()), r"^linear_tpp: ", r"dtype", r"BFloat16")


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_libxsmm_stays_inside_the_module():
    """-Wl,--exclude-libs,ALL: _C exports neither LIBXSMM's functions nor its BLAS stubs."""
    symbols = subprocess.run(["nm", "-D", "--defined-only", _C.__file__], capture_output=True, text=True, check=True).stdout
    leaked = [line.split()[-1] for line in symbols.splitlines() if re.search(r"\b(libxsmm_\w+|[sd]gemm_?)$", line)]
    assert not leaked, f"_C exports LIBXSMM symbols: {leaked[:5]}"


def test_exports_no_cpp_symbol_of_its_own():
    """Stages 06, 07 and 08 share the C++ namespace tpp: one process loads all three."""
    assert_exports_no_symbol_of(_C.__file__, "tpp")


# -- no ATen matrix product anywhere in this stage's source: LIBXSMM does every GEMM ------
def test_no_aten_matrix_product_in_the_source():
    assert_no_matrix_product(STAGE)  # common/tests shows this check finds stage 04's calls


def test_no_aten_matrix_product_runs():
    """What the built module dispatches, forward and backward, on a shape with partial blocks
    (common/tests shows the check sees stage 04's at::addmm through its extension)."""
    for dtype in (torch.float32, torch.float64):
        layer = Layer(67, 131, dtype=dtype)
        x = torch.randn(5, 3, 67, dtype=dtype, requires_grad=True)
        assert_dispatches_no_matrix_product(lambda: layer(x).sum().backward())
