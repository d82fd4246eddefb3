"""Stage 14's tests: each recipe's promise, checked so that it can fail.

MulConstant: the backward takes the None path through a real graph. Cube: gradgradcheck raises
on the wrong double backward and passes the right ones. Conv+BN: every piece passes gradcheck in
float64, the module equals nn.Conv2d + nn.BatchNorm2d (outputs, all four gradients, running
statistics, eval mode), the fused Function saves exactly what it says, bad input is refused
with the value named, and the memory script runs."""

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.gradcheck import GradcheckError

from eml.autograd_recipes import (BatchNormFunction, Conv2dFunction, Cube, CubeWithBackwardFunction, CubeWrong,
                                  FusedConvBN, FusedConvBNFunction, MulConstant, TOUR, conv_bn, memory)
from eml.autograd_recipes.conv_bn import FusedConvBNFunctionByFormula, conv2d_weight_grad_by_formula

D = torch.float64


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny shapes: one thread (waking OpenMP threads costs more than the work; conv_bn.one_thread)."""
    with conv_bn.one_thread():
        yield


def leaf(*shape, seed=0, low=None):
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.randn(shape, dtype=D, generator=generator) if low is None else torch.empty(shape, dtype=D).uniform_(low, low + 1, generator=generator)
    return tensor.requires_grad_()


# ---- MulConstant ----
def test_mul_constant_value_and_gradcheck():
    x = leaf(3, 5)
    torch.testing.assert_close(MulConstant.apply(x, -1.5), x * -1.5)
    assert torch.autograd.gradcheck(lambda t: MulConstant.apply(t, -1.5), (x,))
    assert torch.autograd.gradgradcheck(lambda t: MulConstant.apply(t, 3), (x,))


class DropGradient(torch.autograd.Function):
    """A later Function whose backward gives no gradient to its input."""

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


def grads_received(function):
    """What `function`'s backward receives when the only use of its output drops the gradient."""
    seen = []

    class Spy(function):
        @staticmethod
        def backward(ctx, grad_output):
            seen.append(grad_output)
            return function.backward(ctx, grad_output)

    x, other = leaf(2, 3), leaf(2, 3, seed=1)
    (DropGradient.apply(Spy.apply(x, 2.0)) + other).sum().backward()
    return seen, x


def test_mul_constant_backward_gets_none_and_returns_none():
    seen, x = grads_received(MulConstant)
    assert len(seen) == 1 and seen[0] is None, f"expected backward(None), got {seen}"
    assert x.grad is None  # None in, None out: no zeros allocated anywhere
    assert MulConstant.backward(None, None) == (None, None)


def test_without_the_flag_backward_gets_zeros():
    """The contrast that makes the flag worth knowing: by default autograd materializes zeros."""

    class Materialized(MulConstant):
        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.constant = inputs[1]  # no set_materialize_grads(False)

    seen, x = grads_received(Materialized)
    assert len(seen) == 1 and isinstance(seen[0], torch.Tensor) and not seen[0].any()
    assert x.grad is not None and not x.grad.any()


@pytest.mark.parametrize("constant", ["2", torch.tensor(2.0), None, True])
def test_mul_constant_rejects_a_constant_that_is_not_a_number(constant):
    with pytest.raises(TypeError, match="Python number"):
        MulConstant.apply(torch.ones(2), constant)


# ---- Cube: double backward ----
@pytest.mark.parametrize("function", [CubeWrong, Cube, CubeWithBackwardFunction])
def test_every_cube_passes_gradcheck(function):
    x = leaf(7)
    torch.testing.assert_close(function.apply(x), x ** 3)
    assert torch.autograd.gradcheck(function.apply, (x,))


def test_gradgradcheck_catches_the_wrong_double_backward():
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        torch.autograd.gradgradcheck(CubeWrong.apply, (leaf(7),))


@pytest.mark.parametrize("function", [Cube, CubeWithBackwardFunction])
def test_gradgradcheck_passes_the_right_double_backward(function):
    assert torch.autograd.gradgradcheck(function.apply, (leaf(7),))


@pytest.mark.parametrize("function", [Cube, CubeWithBackwardFunction])
def test_second_derivative_is_6x(function):
    x = leaf(5)
    (first,) = torch.autograd.grad(function.apply(x).sum(), x, create_graph=True)
    (second,) = torch.autograd.grad(first.sum(), x)
    torch.testing.assert_close(first, 3 * x.detach() ** 2)
    torch.testing.assert_close(second, 6 * x.detach())


def test_the_wrong_cube_loses_the_history():
    x = leaf(5)
    (first,) = torch.autograd.grad(CubeWrong.apply(x).sum(), x, create_graph=True)
    torch.testing.assert_close(first, 3 * x.detach() ** 2)  # the value is right...
    assert not first.requires_grad  # ...but nothing connects it to x any more


# ---- Conv + BN: the pieces ----
# (N, C_in, H, W, C_out, kernel, padding): batch 1, primes, non-square kernels and padding, 1x1 kernels.
SHAPES = [
    (1, 1, 4, 3, 2, (3, 3), 1),
    (2, 3, 7, 5, 4, (3, 2), 1),
    (3, 2, 5, 6, 5, (1, 1), 0),
    (2, 1, 4, 4, 3, (2, 3), (1, 2)),
]


def conv_leaves(n, c, h, w, o, kernel, seed=0):
    return leaf(n, c, h, w, seed=seed), leaf(o, c, *kernel, seed=seed + 1)


@pytest.mark.parametrize("shape", SHAPES)
def test_conv_function_matches_conv2d_and_passes_gradcheck(shape):
    *sizes, padding = shape
    x, W = conv_leaves(*sizes)
    ours = Conv2dFunction.apply(x, W, padding)
    expected = F.conv2d(x, W, padding=padding)
    torch.testing.assert_close(ours, expected)
    g = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(ours, (x, W), g), torch.autograd.grad(expected, (x, W), g)):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda x, W: Conv2dFunction.apply(x, W, padding), (x, W))


def test_conv_function_double_backward():
    x, W = conv_leaves(2, 2, 4, 4, 3, (2, 2))
    assert torch.autograd.gradgradcheck(lambda x, W: Conv2dFunction.apply(x, W, 1), (x, W))


def test_conv_function_empty_batch():
    x, W = conv_leaves(0, 2, 5, 5, 3, (3, 3))
    y = Conv2dFunction.apply(x, W, 0)
    assert y.shape == (0, 3, 3, 3)
    grad_x, grad_W = torch.autograd.grad(y.sum(), (x, W))
    assert grad_x.shape == x.shape and torch.equal(grad_W, torch.zeros_like(W))


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 3, 1), (5, 1, 1, 1)])
def test_batch_norm_function_matches_F_batch_norm(shape):
    y, w, b = leaf(*shape), leaf(shape[1], seed=1, low=0.5), leaf(shape[1], seed=2)
    stats = [torch.zeros(shape[1], dtype=D), torch.ones(shape[1], dtype=D)]
    reference_stats = [s.clone() for s in stats]
    ours = BatchNormFunction.apply(y, w, b, *stats, 0.3, 1e-3)
    expected = F.batch_norm(y, *reference_stats, w, b, True, 0.3, 1e-3)
    torch.testing.assert_close(ours, expected)
    for got, want in zip(stats, reference_stats):
        torch.testing.assert_close(got, want)
    g = torch.randn_like(expected)
    for got, want in zip(torch.autograd.grad(ours, (y, w, b), g), torch.autograd.grad(expected, (y, w, b), g)):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda y, w, b: BatchNormFunction.apply(y, w, b), (y, w, b))


@pytest.mark.parametrize("shape", SHAPES)
def test_fused_function_passes_gradcheck(shape):
    *sizes, padding = shape
    x, W = conv_leaves(*sizes)
    w, b = leaf(sizes[4], seed=3, low=0.5), leaf(sizes[4], seed=4)
    assert torch.autograd.gradcheck(lambda x, W, w, b: FusedConvBNFunction.apply(x, W, w, b, padding), (x, W, w, b))


@pytest.mark.parametrize("shape", SHAPES)
def test_the_weight_gradient_formula_equals_torchs(shape):
    *sizes, padding = shape
    x, W = conv_leaves(*sizes)
    g = torch.randn_like(F.conv2d(x, W, padding=padding))
    torch.testing.assert_close(conv2d_weight_grad_by_formula(g, x, padding),
                               torch.nn.grad.conv2d_weight(x, W.shape, g, padding=padding))
    w, b = leaf(sizes[4], seed=3, low=0.5), leaf(sizes[4], seed=4)
    assert torch.autograd.gradcheck(lambda x, W, w, b: FusedConvBNFunctionByFormula.apply(x, W, w, b, padding), (x, W, w, b))


def test_gradcheck_catches_a_fused_backward_that_forgets_the_batch_mean():
    """The check can fail: drop the term that flows through the batch mean from grad_input."""

    class Forgetful(FusedConvBNFunction):
        @staticmethod
        def backward(ctx, grad_output):
            grads = list(FusedConvBNFunction.backward(ctx, grad_output))
            _, conv_weight, bn_weight, _, invstd = ctx.saved_tensors
            # The right grad_input has "- w/std * mean(g)" (per channel) inside the convolution's
            # backward; adding it back gives the backward of a batch norm whose mean is a constant.
            mean_term = conv_bn.per_channel(bn_weight * invstd * grad_output.mean(conv_bn.DIMS))
            grads[0] = grads[0] + F.conv_transpose2d(mean_term.expand_as(grad_output), conv_weight, padding=ctx.padding)
            return tuple(grads)

    x, W = conv_leaves(2, 2, 4, 4, 3, (3, 3))
    w, b = leaf(3, seed=3, low=0.5), leaf(3, seed=4)
    with pytest.raises(GradcheckError, match=r"Jacobian mismatch for output 0 with respect to input 0"):  # grad_x lacks a term
        torch.autograd.gradcheck(lambda x, W, w, b: Forgetful.apply(x, W, w, b, 1), (x, W, w, b))


@pytest.mark.parametrize("function", ["bn", "fused"])
def test_double_backward_is_refused_not_silently_wrong(function):
    x, W = conv_leaves(2, 2, 4, 4, 3, (3, 3))
    w, b = leaf(3, seed=3, low=0.5), leaf(3, seed=4)
    y = BatchNormFunction.apply(x, leaf(2, seed=5), leaf(2, seed=6)) if function == "bn" else FusedConvBNFunction.apply(x, W, w, b, 1)
    (grad_x,) = torch.autograd.grad((y ** 2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad_x.sum().backward()


# ---- Conv + BN: the module against torch's two modules ----
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_module_matches_conv2d_then_batchnorm2d(shape, fused):
    n, c, h, w, o, kernel, padding = shape
    errors = conv_bn.compare_with_torch(fused, (n, c, h, w), o, kernel, padding, steps=3)
    assert max(errors.values()) < 1e-12, errors


def torch_and_ours(fused=True, momentum=0.1, track_running_stats=True, padding=1):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2, 3, 3, padding=padding, bias=False, dtype=D)
    bn = torch.nn.BatchNorm2d(3, momentum=momentum, track_running_stats=track_running_stats, dtype=D)
    return conv, bn, FusedConvBN.from_modules(conv, bn, fused=fused)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_running_statistics_and_eval_mode_follow_batchnorm2d(momentum):
    conv, bn, ours = torch_and_ours(momentum=momentum)
    for seed in range(3):
        x = leaf(4, 2, 5, 5, seed=seed)
        bn(conv(x)), ours(x)
    torch.testing.assert_close(ours.running_mean, bn.running_mean)
    torch.testing.assert_close(ours.running_var, bn.running_var)
    assert ours.num_batches_tracked.item() == bn.num_batches_tracked.item() == 3
    bn.eval(), ours.eval()
    x = leaf(1, 2, 3, 3, seed=9)  # eval mode: even one value per channel is fine
    torch.testing.assert_close(ours(x), bn(conv(x)))


def test_without_running_statistics_both_use_the_batch_in_eval_mode():
    conv, bn, ours = torch_and_ours(track_running_stats=False)
    assert ours.running_mean is None
    bn.eval(), ours.eval()
    x = leaf(3, 2, 4, 4)
    torch.testing.assert_close(ours(x), bn(conv(x)))


@pytest.mark.parametrize("frozen", [("input",), ("conv_weight",), ("input", "conv_weight"), ("bn_weight", "bn_bias"), ("input", "bn_weight")])
def test_only_the_requested_gradients(frozen):
    conv, bn, ours = torch_and_ours()
    x = leaf(2, 2, 4, 4)
    theirs = {"input": x, "conv_weight": conv.weight, "bn_weight": bn.weight, "bn_bias": bn.bias}
    mine = {"input": x, "conv_weight": ours.conv_weight, "bn_weight": ours.bn_weight, "bn_bias": ours.bn_bias}
    for name in frozen:
        theirs[name].requires_grad_(False), mine[name].requires_grad_(False)
    wanted = [name for name in theirs if name not in frozen]
    g = torch.randn(2, 3, 4, 4, dtype=D)
    want = torch.autograd.grad(bn(conv(x)), [theirs[n] for n in wanted], g)
    got = torch.autograd.grad(ours(x), [mine[n] for n in wanted], g)
    for name, a, b in zip(wanted, got, want):
        torch.testing.assert_close(a, b, msg=lambda m: f"{name}: {m}")


# ---- What is saved for backward ----
def test_the_fused_function_saves_no_convolution_output():
    conv, bn, fused = torch_and_ours()
    x = torch.randn(4, 2, 6, 6, dtype=D)
    conv_output_bytes = conv(x).untyped_storage().nbytes()
    net_torch, net_fused = torch.nn.Sequential(conv, bn, torch.nn.Flatten()), torch.nn.Sequential(fused, torch.nn.Flatten())
    target = torch.zeros(4, dtype=torch.long)
    theirs, ours = memory.saved_bytes(net_torch, x, target), memory.saved_bytes(net_fused, x, target)
    # What the loss saves (log_softmax's output, the target...), the same after either net:
    loss_only = memory.saved_bytes(torch.nn.Flatten(), leaf(4, 3, 6, 6), target)["activations"]
    # Fused: the input x and two (C,) vectors, mean and 1/std (parameters are counted apart).
    assert ours["activations"] == x.nbytes + 2 * 3 * 8 + loss_only
    assert theirs["activations"] - ours["activations"] >= conv_output_bytes
    # Parameters: both save the convolution's weight and batch norm's weight (not its bias).
    assert ours["parameters"] == theirs["parameters"] == fused.conv_weight.nbytes + fused.bn_weight.nbytes


def test_memory_measurements_run_on_a_tiny_net():
    input, target = memory.make_data(4)
    saved = {kind: memory.saved_bytes(memory.make_net(kind, (2, 3)), input, target) for kind in memory.KINDS}
    # pieces save what torch saves, less the running statistics (2 per layer); fused saves less.
    assert saved["fused"]["activations"] < saved["pieces"]["activations"] == saved["torch"]["activations"] - 2 * (2 + 3) * 4
    assert saved["fused_formula"] == saved["fused"]
    assert memory.allocator_peak(memory.make_net("fused", (2, 3)), input, target, steps=1) > 0
    assert memory.rss_peak("fused", 4, 1, (2, 3)) > 0  # the fresh-process route works


def test_the_nets_start_from_the_same_weights():
    input, _ = memory.make_data(3)
    outputs = [memory.make_net(kind, (2, 3))(input) for kind in memory.KINDS]
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0])


# ---- Bad input: a clear exception that names the value ----
def bad_calls():
    x, W, w, b = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3), torch.ones(4), torch.zeros(4)
    fused = lambda *args: FusedConvBNFunction.apply(*args)
    return [
        ("3-d input", lambda: fused(x[0], W, w, b), ValueError, r"4-d input .*\[3, 5, 5\]"),
        ("channels", lambda: fused(torch.randn(2, 5, 5, 5), W, w, b), ValueError, "expected 3 input channels .* got 5"),
        ("dtype", lambda: fused(x.double(), W, w, b), TypeError, "float32 .* got torch.float64"),
        ("integer input", lambda: Conv2dFunction.apply(x.long(), W.long()), TypeError, "floating-point .* torch.int64"),
        ("kernel too big", lambda: Conv2dFunction.apply(x, torch.randn(4, 3, 7, 7)), ValueError, r"kernel \[7, 7\]"),
        ("negative padding", lambda: fused(x, W, w, b, -1), ValueError, "padding .* got -1"),
        ("bn weight shape", lambda: fused(x, W, torch.ones(5), b), ValueError, r"weight of shape \[4\].*shape \[5\]"),
        ("one value per channel", lambda: fused(torch.randn(1, 3, 3, 3), W, w, b), ValueError, "more than 1 value per channel, got 1"),
        ("momentum", lambda: BatchNormFunction.apply(x, torch.ones(3), torch.zeros(3), torch.zeros(3), torch.ones(3), 1.5), ValueError, "momentum .* 1.5"),
        ("eps", lambda: BatchNormFunction.apply(x, torch.ones(3), torch.zeros(3), None, None, 0.1, 0.0), ValueError, "eps > 0, got 0.0"),
        ("one running stat", lambda: BatchNormFunction.apply(x, torch.ones(3), torch.zeros(3), torch.zeros(3), None), ValueError, "both running_mean and running_var"),
        ("stride 2", lambda: FusedConvBN.from_modules(torch.nn.Conv2d(3, 4, 3, stride=2, bias=False), torch.nn.BatchNorm2d(4)), ValueError, "stride 1"),
        ("conv bias", lambda: FusedConvBN.from_modules(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)), ValueError, "no bias"),
        ("bn channels", lambda: FusedConvBN.from_modules(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(5)), ValueError, "over 4 channels"),
        ("kernel size 0", lambda: FusedConvBN(3, 4, 0), ValueError, "kernel sizes >= 1"),
    ]


@pytest.mark.parametrize("label,call,error,match", bad_calls(), ids=[c[0] for c in bad_calls()])
def test_bad_input_is_refused_with_its_value(label, call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---- The tour's lines ----
@pytest.mark.parametrize("label", list(TOUR["checks"]))
def test_tour_checks_pass(label):
    ok, line = TOUR["checks"][label]()
    assert ok, line
    assert "FAIL" not in line
