"""Stage 07's tests: stage 06's contracts for float32 and float64 (the Layer stays a drop-in for
torch.nn.Linear), and what is new: bfloat16 through the shared bf16 and autocast checks
(common/eml/common/bf16_checks.py) on every bf16 path this CPU can run: the default path (the
VNNI kernels where they are native, else the fp32 path), the "vnni" path wherever LIBXSMM
generates bf16 kernels (any AVX-512 CPU, native or emulated), and the "reference" path,
which runs the VNNI-2 packing, the bf16 loop nest, fp32 accumulation and the one rounding with a
plain C++ micro-kernel in place of the JIT one, also with tiny blocks so that every tail runs;
the VNNI-2 layout against a Python reference; the bf16 path as a property of the state; the
bf16 peak probe; the tour entry. Plus stage 06's checks of the state, the pack cache, NULL
kernels, the build and the source."""

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

from eml.common.bf16_checks import Bf16LayerTests
from eml.common.checks import CASES, Case, FunctionTests, LayerTests, assert_close, expect_error
from eml.common.cpp_checks import (
    AWKWARD, CppModuleTests, assert_exports_no_symbol_of, assert_no_matrix_product, assert_results_close, everything,
    expected_grads, tensors,
)
from eml.common.cpp_checks import assert_dispatches_no_matrix_product, assert_matches_torch_in_turns_and_on_two_threads
from eml.linear_tpp_bf16 import TOUR, Function, Layer, _C, bf16_path, peak_gflops, peak_gflops_bf16

STAGE = pathlib.Path(__file__).resolve().parents[1]  # 07_tpp_bf16/, as shipped in the repository

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

    prefix = "linear_tpp_bf16"
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


# -- bfloat16: the shared checks on every path this CPU runs ---------------------------------
def reference_path_layer(*args, **kwargs):
    """A Layer whose bf16 products run the VNNI-2 loop nest with the plain C++ micro-kernel."""
    layer = Layer(*args, **kwargs)
    layer.bf16_path = "reference"
    return layer


def reference_path_tiny_block_layer(*args, **kwargs):
    layer = reference_path_layer(*args, **kwargs)
    layer.state.set_config(**TINY_BLOCKS, n_outer=[True, False, True])
    return layer


class TestBf16(Bf16LayerTests):
    """The default bf16 path: VNNI kernels where they are native, else the fp32 path."""

    make_layer = staticmethod(Layer)


class TestBf16ReferencePath(Bf16LayerTests):
    make_layer = staticmethod(reference_path_layer)


def fp32_path_layer(*args, **kwargs):
    """A Layer whose bf16 products widen to float32 and run the float32 loop nest."""
    layer = Layer(*args, **kwargs)
    layer.bf16_path = "fp32"
    return layer


class TestBf16Fp32Path(Bf16LayerTests):
    """The float32 path even where the VNNI kernels are the default (Zen 4/5): every shared bf16
    and autocast check, not only the default path's."""

    make_layer = staticmethod(fp32_path_layer)


def vnni_path_layer(*args, **kwargs):
    """A Layer on LIBXSMM's bf16 kernels, whether or not they are this CPU's default."""
    layer = Layer(*args, **kwargs)
    layer.bf16_path = "vnni"
    return layer


@pytest.mark.skipif(not _C.bf16_kernels_available(), reason="LIBXSMM generates no bf16 kernels for this CPU (AVX2)")
class TestBf16VnniPath(Bf16LayerTests):
    """The VNNI kernels on any AVX-512 CPU: native with AVX512-BF16, emulated without."""

    make_layer = staticmethod(vnni_path_layer)


class TestBf16ReferencePathTinyBlocks(Bf16LayerTests):
    """Tiny blocks: every tail kernel, odd k padded to a pair, several batch-reduce blocks."""

    make_layer = staticmethod(reference_path_tiny_block_layer)


# Every bf16 path this CPU can run: "vnni" wherever LIBXSMM generates bf16 kernels, native or
# emulated (any AVX-512 CPU), even where it is not the default path.
VNNI = pytest.param("vnni", marks=pytest.mark.skipif(not _C.bf16_kernels_available(),
                                                      reason="LIBXSMM generates no bf16 kernels for this CPU (AVX2)"))


@pytest.mark.parametrize("path", ["fp32", "reference", VNNI])
@pytest.mark.parametrize("case", AWKWARD, ids=str)
def test_bf16_paths_on_awkward_shapes(case, path):
    """Output and gradients straight from the extension against torch's float64 products of the
    same bf16 values: fp32 accumulation and one rounding leave about one bf16 rounding of error."""
    input, weight, bias, grad_output = (t.bfloat16() for t in tensors(case, torch.float32))
    state = _C.LinearState(case.in_features, case.out_features)
    state.bf16_path = path
    got = everything(_C, input, weight, bias, grad_output, state)
    x, w, b, gy = (t.double() for t in (input, weight, bias, grad_output))
    want = [F.linear(x, w, b), *expected_grads(x, w, gy)]
    n = math.prod(case.leading)
    for name, g, e, terms in zip(["output", "grad_input", "grad_weight", "grad_bias"], got, want,
                                 [case.in_features, case.out_features, n, n]):
        assert g.dtype == torch.bfloat16 and g.shape == e.shape, f"{name}: {g.dtype} {tuple(g.shape)}"
        # one rounding (2^-8 relative) plus fp32 summation error of `terms` products
        scale = e.abs().max().item() if e.numel() else 0.0
        torch.testing.assert_close(g.double(), e, rtol=2.0**-8, atol=1e-6 * max(1, terms) * max(1.0, scale),
                                   msg=lambda m: f"{name} {case} {path}: {m}")


def test_bf16_paths_agree_closely():
    """Every path this CPU runs (fp32, the reference micro-kernel, and the VNNI kernels where
    LIBXSMM makes them): fp32 sums rounded once, so any two differ at most by one bf16 rounding
    step, and only on a few elements."""
    input, weight, bias, _ = (t.bfloat16() for t in tensors(Case((131,), 257, 263), torch.float32))
    results = {}
    for path in ["fp32", "reference"] + (["vnni"] if _C.bf16_kernels_available() else []):
        state = _C.LinearState(257, 263)
        state.bf16_path = path
        results[path] = _C.forward(input, weight, bias, state).float()
    for path, result in results.items():
        differ = result != results["fp32"]
        assert differ.float().mean() < 0.05, f"{path}: most elements round to the same bf16 as fp32's"
        torch.testing.assert_close(result, results["fp32"], rtol=2.0**-7, atol=0, msg=lambda m: f"{path}: {m}")


def python_vnni2(a, bm):
    """The VNNI-2 layout in PyTorch: [panel][k/2][row][2], zero padding for odd k and the tail panel."""
    m, k = a.shape
    panels, k2 = (m + bm - 1) // bm, (k + 1) // 2
    padded = torch.zeros(panels * bm, 2 * k2, dtype=a.dtype)
    padded[:m, :k] = a
    return padded.reshape(panels, bm, k2, 2).permute(0, 2, 1, 3).contiguous()


@pytest.mark.parametrize("m, k, bm", [(1, 1, 1), (3, 5, 2), (4, 4, 4), (7, 9, 3), (64, 33, 64), (5, 2, 8)])
def test_pack_vnni2_matches_the_layout(m, k, bm):
    a = torch.randn(m, k).bfloat16()
    packed = _C.pack_vnni2(a, bm)
    assert packed.shape == (-(-m // bm), (k + 1) // 2, bm, 2)
    assert torch.equal(packed, python_vnni2(a, bm))
    # the picture of the README: row i, pair p holds A[i][2p] and A[i][2p + 1], side by side
    first_pair = a[0, :2] if k >= 2 else torch.stack([a[0, 0], torch.zeros((), dtype=a.dtype)])
    assert torch.equal(packed[0, 0, 0], first_pair)


def test_pack_vnni2_refuses_bad_input():
    expect_error(lambda: _C.pack_vnni2(torch.randn(3, 4), 2), r"^linear_tpp_bf16: ", r"BFloat16", r"got 2-d Float\b")
    expect_error(lambda: _C.pack_vnni2(torch.randn(4).bfloat16(), 2), r"^linear_tpp_bf16: ", r"2-d", r"\b1-d")
    expect_error(lambda: _C.pack_vnni2(torch.randn(3, 4).bfloat16(), 0), r"^linear_tpp_bf16: ", r"bm >= 1", r"\b0\b")


# -- the bf16 path: chosen at run time, a property of the state --------------------------------
def test_default_path_follows_the_cpu():
    # "vnni" only where the bf16 kernels are native: LIBXSMM's emulated ones (AVX-512 without
    # AVX512-BF16) are slower than the fp32 path, and AVX2 gets none. The oracle is the CPU's own
    # flags, not the code under test (unless LIBXSMM_TARGET overrides what LIBXSMM sees).
    flags = set(re.search(r"^flags\s*:(.*)$", pathlib.Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    if "LIBXSMM_TARGET" not in os.environ:
        assert _C.bf16_kernels_native() == ("avx512_bf16" in flags)
        assert Layer(5, 3).bf16_path == ("vnni" if "avx512_bf16" in flags else "fp32")
    if _C.target_arch() == "hsw":
        assert not _C.bf16_kernels_available(), "LIBXSMM 1.17 generates no bf16 kernels for AVX2"
    layer = Layer(5, 3)
    assert layer.bf16_path == layer.state.bf16_path == bf16_path()
    assert f"bf16_path={bf16_path()}" in repr(layer.state)


def test_bf16_path_refuses_what_cannot_run():
    state = _C.LinearState(5, 3)
    expect_error(lambda: setattr(state, "bf16_path", "fast"), r"^linear_tpp_bf16: ", r"vnni", r"reference", r"fp32", r'"fast"')
    if not _C.bf16_kernels_available():
        expect_error(lambda: setattr(state, "bf16_path", "vnni"), r"^linear_tpp_bf16: ", r"vnni", r"no AVX-512",
                     re.escape(_C.target_arch()))
        assert state.bf16_path == "fp32", "unchanged after a refusal"


def test_bf16_path_travels_with_deepcopy():
    layer = reference_path_layer(6, 4)
    assert copy.deepcopy(layer).bf16_path == "reference"


@pytest.mark.parametrize("path", ["fp32", "reference"])
def test_bf16_inference_packs_once_and_switching_path_repacks(path):
    layer = Layer(65, 33, dtype=torch.bfloat16)
    layer.bf16_path = path
    x = torch.randn(7, 65).bfloat16()
    first = inference(layer, x)
    assert torch.equal(inference(layer, x), first) and layer.state.packs == 1
    layer.bf16_path = "reference" if path == "fp32" else "fp32"
    inference(layer, x)
    assert layer.state.packs == 2, "switching the path drops the pack (set_bf16_path invalidates): packed again"


def test_bf16_peak_probe_or_none():
    if _C.bf16_kernels_available():
        peak = peak_gflops_bf16()
        assert isinstance(peak, float) and math.isfinite(peak) and peak > 0
    else:
        assert peak_gflops_bf16() is None
        expect_error(lambda: _C.peak_gflops_bf16(), r"^linear_tpp_bf16: ", r"no bf16 kernels", re.escape(_C.target_arch()))


def test_autocast_float16_is_refused_clearly():
    layer = Layer(4, 3)
    with torch.autocast("cpu", dtype=torch.float16):
        expect_error(lambda: layer(torch.randn(2, 4)), r"^linear_tpp_bf16: ", r"autocast to torch\.float16", r"only torch\.bfloat16")


def test_bf16_training_steps_follow_nn_linear():
    """A few SGD steps of a bf16 model: the losses stay within bf16 noise of nn.Linear's."""
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(20, 33), torch.nn.Tanh(), torch.nn.Linear(33, 5)).bfloat16()
    model = torch.nn.Sequential(Layer(20, 33), torch.nn.Tanh(), Layer(33, 5)).bfloat16()
    model.load_state_dict(reference.state_dict())
    x, target = torch.randn(70, 20).bfloat16(), torch.randn(70, 5).bfloat16()
    for m in (reference, model):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        losses = []
        for _ in range(4):
            optimizer.zero_grad()
            loss = F.mse_loss(m(x), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        m.losses = losses
    assert model.losses[-1] < model.losses[0], "it learns"
    torch.testing.assert_close(torch.tensor(model.losses), torch.tensor(reference.losses), rtol=2e-2, atol=0)


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
    expect_error(lambda: state.set_config([0, 2, 2], [2, 2, 2], [2, 2, 2], [False] * 3), r"^linear_tpp_bf16: ", r"forward", r"bm >= 1", r"\[0, 2, 2\]")
    expect_error(lambda: state.set_config([2, 2, 2], [2, 2, -1], [2, 2, 2], [False] * 3), r"^linear_tpp_bf16: ", r"grad_input", r"-1")
    expect_error(lambda: state.set_config([2, 2, 2], [2, 2, 2], [2, 2], [False] * 3), r"^linear_tpp_bf16: ", r"grad_weight")
    expect_error(lambda: state.set_config([2, 2, 2], [2, 2, 2], [2, 2, 2], [False]), r"^linear_tpp_bf16: ", r"n_outer", r"\b1\b")


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
    expect_error(lambda: _C.forward(x, w, None, state), r"^linear_tpp_bf16: ", r"LinearState", r"in_features=5", r"in_features=6")
    expect_error(lambda: _C.backward(torch.randn(4, 3), x, w, True, True, False, state), r"^linear_tpp_bf16: ", r"in_features=5")
    # check_inputs runs first: a bad weight is reported as such, not as a state mismatch.
    expect_error(lambda: _C.forward(x, torch.randn(3, 5), None, state), r"^linear_tpp_bf16: ", r"input features", r"\b6\b")
    expect_error(lambda: _C.LinearState(-1, 3), r"^linear_tpp_bf16: ", r"in_features", r"-1")


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
        r"^linear_tpp_bf16: ", r"NULL", r"m=48", r"n=32", r"k=16", r"lda=16", r"ldb=16", r"ldc=48", r"flags=1 \(TRANS_A\)",
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
    assert TOUR["bf16_layers"] == {"07 tpp bf16": Layer}
    assert all(len(label) <= 22 for label in TOUR["bf16_layers"]), "the tour's table has 22 characters for a label"
    assert TOUR["peak_gflops_bf16"] is peak_gflops_bf16 and TOUR["bf16_path"] is bf16_path
    ok, line = TOUR["checks"]["07 tpp bf16 float32"]()
    assert ok and "gradcheck: pass" in line, line
    points = {point.name: point for point in importlib.metadata.entry_points(group="eml.tour")}
    assert points["07_tpp_bf16"].value == "eml.linear_tpp_bf16:TOUR"


def test_float_double_and_bfloat16_only():
    # LIBXSMM's GEMMs are built for float, double and (VNNI) bfloat16 here; half is refused.
    x, w = torch.randn(4, 6), torch.randn(3, 6)
    expect_error(lambda: _C.forward(x.half(), w.half()), r"^linear_tpp_bf16: ", r"dtype", r"Half", r"BFloat16")
    assert _C.forward(x.bfloat16(), w.bfloat16()).dtype == torch.bfloat16
    expect_error(lambda: _C.forward(x.bfloat16(), w), r"^linear_tpp_bf16: ", r"expected the input dtype Float \(the weight's\), got BFloat16")


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
    """What the built module dispatches, forward and backward, in float32 and in bfloat16 on the
    path this CPU runs (common/tests shows the check sees stage 04's at::addmm)."""
    for dtype in (torch.float32, torch.bfloat16):
        layer = Layer(67, 131, dtype=dtype)
        x = torch.randn(5, 3, 67, dtype=dtype, requires_grad=True)
        assert_dispatches_no_matrix_product(lambda: layer(x).float().sum().backward())
