"""Stage 14, recipe 3: convolution + batch norm fused into one Function that saves less.

What this teaches: what a Function saves for backward is memory held from the forward until
the backward, for every layer of the net at once. ``nn.Conv2d`` followed by ``nn.BatchNorm2d``
(training mode) keeps the convolution's output alive only so that batch norm's backward can
use it. The fused Function saves the convolution's *input* (kept anyway: the convolution's
weight gradient needs it) and two numbers per channel, and recomputes the convolution's output
in backward: one more convolution per step, one activation tensor less per layer.

The pieces, each checked against torch with ``gradcheck`` in float64 (tests/test_stage.py):

1. ``Conv2dFunction``: 2-d convolution, stride 1, zero padding, no bias, no groups;
   grad_input = conv_transpose2d(g, W); grad_weight = torch.nn.grad.conv2d_weight(x, W.shape, g)
   (the formula conv2d(x^T, g^T)^T, batch <-> channels, is kept as conv2d_weight_grad_by_formula
   for the memory script: it copies its operands).
2. ``BatchNormFunction``: batch norm in training mode with a weight and a bias, over the
   batch and both spatial dimensions, updating running statistics like ``nn.BatchNorm2d``.
3. ``FusedConvBNFunction``: 1 then 2 in one forward; backward recomputes the convolution.
4. ``FusedConvBN``: the module (``fused=False`` runs 1 and 2 as two Functions instead).

Batch norm's backward uses the batch mean and 1/std saved by forward, which carry no autograd
history (recipe 2, ``CubeWrong``): a second derivative through them would be silently wrong, so
2 and 3 are ``once_differentiable`` and double backward raises instead. Written after PyTorch's
tutorial "Fusing Convolution and Batch Norm using Custom Function"; the code is our own.
Run it: ``pip install --no-build-isolation .`` in 14_autograd_recipes, then ``pytest tests``;
``python -m eml.autograd_recipes.memory`` measures the memory saved.
"""

import contextlib
import math
import numbers

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

DIMS = (0, 2, 3)  # batch norm's statistics: over the batch and both spatial dimensions


def per_channel(vector):
    """(C,) -> (1, C, 1, 1), to broadcast against an (N, C, H, W) tensor."""
    return vector[None, :, None, None]


# ---- 0. Input checks: say what is wrong, and with which value ----
def check_pair(value, name):
    """An int or a pair of ints >= 0 (padding) -> a pair of ints."""
    pair = (value, value) if isinstance(value, numbers.Integral) else tuple(value) if isinstance(value, (tuple, list)) else None
    if (pair is None or len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0 for v in pair)):
        raise ValueError(f"conv_bn: expected {name} as an int >= 0 or a pair of them, got {value!r}")
    return tuple(int(v) for v in pair)


def check_conv_inputs(input, weight, padding):
    """Validate a stride-1 convolution's arguments; return the padding as a pair."""
    if not isinstance(input, torch.Tensor) or input.dim() != 4:
        raise ValueError(f"conv_bn: expected a 4-d input (N, C, H, W), got {getattr(input, 'shape', type(input).__name__)}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
        raise ValueError(f"conv_bn: expected a 4-d convolution weight (C_out, C_in, kH, kW), got {getattr(weight, 'shape', type(weight).__name__)}")
    if not input.is_floating_point():
        raise TypeError(f"conv_bn: expected a floating-point input, got {input.dtype}")
    if input.dtype != weight.dtype:
        raise TypeError(f"conv_bn: expected input dtype {weight.dtype} (the weight's), got {input.dtype}")
    if input.device != weight.device:
        raise ValueError(f"conv_bn: expected the input on the weight's device {weight.device}, got {input.device}")
    if input.shape[1] != weight.shape[1]:
        raise ValueError(f"conv_bn: expected {weight.shape[1]} input channels (the weight's dim 1), got {input.shape[1]} (input shape {list(input.shape)})")
    padding = check_pair(padding, "padding")
    out_size = [input.shape[2 + d] + 2 * padding[d] - weight.shape[2 + d] + 1 for d in range(2)]
    if min(out_size) < 1:
        raise ValueError(f"conv_bn: kernel {list(weight.shape[2:])} is larger than the padded input {list(input.shape[2:])} + 2 * {list(padding)}")
    return padding


def check_bn_inputs(input, weight, bias, running_mean, running_var, momentum, eps):
    """Validate batch norm's arguments (training mode: statistics need 2+ values per channel)."""
    if input.dim() != 4:
        raise ValueError(f"conv_bn: expected a 4-d input to batch norm (N, C, H, W), got shape {list(input.shape)}")
    channels = input.shape[1]
    for name, tensor in [("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)]:
        if tensor is None and name.startswith("running"):
            continue
        if not isinstance(tensor, torch.Tensor) or tensor.shape != (channels,) or tensor.dtype != input.dtype or tensor.device != input.device:
            got = f"shape {list(tensor.shape)}, {tensor.dtype}, on {tensor.device}" if isinstance(tensor, torch.Tensor) else repr(tensor)
            raise ValueError(f"conv_bn: expected batch norm's {name} of shape [{channels}], {input.dtype}, on {input.device}; got {got}")
    if (running_mean is None) != (running_var is None):
        raise ValueError("conv_bn: give both running_mean and running_var, or neither")
    count = input.numel() // max(channels, 1)
    if count < 2:
        raise ValueError(f"conv_bn: batch norm in training mode needs more than 1 value per channel, got {count} (input shape {list(input.shape)})")
    if not (isinstance(momentum, numbers.Real) and 0 <= momentum <= 1):
        raise ValueError(f"conv_bn: expected a momentum in [0, 1], got {momentum!r}")
    if not (isinstance(eps, numbers.Real) and eps > 0):
        raise ValueError(f"conv_bn: expected eps > 0, got {eps!r}")


# ---- 1. Convolution: stride 1, zero padding, no bias ----
def conv2d_forward(input, weight, padding):
    return F.conv2d(input, weight, padding=padding)


def conv2d_weight_grad_by_formula(grad_output, input, padding):
    """dW[o, c, kh, kw] = sum over n, i, j of g[n, o, i, j] * x_padded[n, c, i + kh, j + kw]:
    a convolution of x with g in which the batch plays the channels' role. Correct (tested), but
    conv2d wants contiguous operands, so both transposes are copied first: a full copy of x and
    of g, alive at once. The memory script measures what that costs (kind fused_formula)."""
    # (C, N, H, W) convolved with (O, N, Ho, Wo) -> (C, O, kH, kW) -> (O, C, kH, kW)
    return F.conv2d(input.transpose(0, 1), grad_output.transpose(0, 1), padding=padding).transpose(0, 1)


def conv2d_backward(grad_output, input, weight, padding, needs_input, needs_weight, weight_grad_by_formula=False):
    """Both gradients of y = conv2d(x, W) with stride 1, each only if asked for.

    grad_input:  each x[n, c, i, j] met W[o, c, kh, kw] at y[n, o, i - kh, j - kw] (+ padding):
                 a transposed convolution of g with W.
    grad_weight: conv2d_weight_grad_by_formula, or (the default) torch.nn.grad.conv2d_weight,
                 which computes the same sum with the kernel torch's own convolution backward
                 uses, reading x and g in place (no copies).
    """
    grad_input = grad_weight = None
    if needs_input:
        grad_input = F.conv_transpose2d(grad_output, weight, padding=padding)
    if needs_weight:
        if input.shape[0] == 0:  # an empty batch contributes nothing (and conv2d rejects 0 channels)
            grad_weight = torch.zeros_like(weight)
        elif weight_grad_by_formula:
            grad_weight = conv2d_weight_grad_by_formula(grad_output, input, padding)
        else:
            grad_weight = torch.nn.grad.conv2d_weight(input, weight.shape, grad_output, padding=padding)
    return grad_input, grad_weight


class Conv2dFunction(torch.autograd.Function):
    """y = conv2d(x, W, padding), stride 1, no bias. Call as Conv2dFunction.apply(x, W, padding)."""

    @staticmethod
    def forward(ctx, input, weight, padding=0):
        ctx.padding = check_conv_inputs(input, weight, padding)
        ctx.save_for_backward(input, weight)  # grad_input needs W, grad_weight needs x
        return conv2d_forward(input, weight, ctx.padding)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        # Differentiable operations on saved inputs only: double backward works (tested).
        grad_input, grad_weight = conv2d_backward(grad_output, input, weight, ctx.padding, *ctx.needs_input_grad[:2])
        return grad_input, grad_weight, None


# ---- 2. Batch norm in training mode ----
def batch_norm_statistics(input, eps):
    """Per-channel mean, biased variance (the one batch norm normalizes with) and 1/std."""
    mean = input.mean(DIMS)
    var = input.var(DIMS, unbiased=False)
    return mean, var, torch.rsqrt(var + eps)


def update_running_stats(running_mean, running_var, mean, var, count, momentum):
    """As nn.BatchNorm2d: r = (1 - m) r + m * batch value; running_var takes the unbiased variance."""
    if running_mean is None:
        return
    with torch.no_grad():
        running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
        running_var.mul_(1 - momentum).add_(var * (count / (count - 1)), alpha=momentum)


def batch_norm_backward(grad_output, normalized, weight, invstd, needs_input, needs_weight, needs_bias):
    """Gradients of y = normalized * w + b with normalized = (x - mean(x)) / std(x), per channel.

    With M values per channel, S1 = sum g and S2 = sum g * normalized (both per channel):
        grad_bias = S1,  grad_weight = S2,
        grad_input = w / std * (g - S1 / M - normalized * S2 / M)
    (the two subtracted terms are what flows through the batch mean and the batch variance).
    Memory: grad_input is computed in place in `normalized`'s buffer, which the caller hands over
    (it is a temporary in both backwards below): one full-size temporary fewer per term.
    """
    count = grad_output.numel() // grad_output.shape[1]
    grad_input = None
    sum_g = grad_output.sum(DIMS) if (needs_input or needs_bias) else None
    sum_g_normalized = (grad_output * normalized).sum(DIMS) if (needs_input or needs_weight) else None
    if needs_input:
        grad_input = normalized.mul_(per_channel(-sum_g_normalized / count))  # overwrites normalized
        grad_input.add_(grad_output).sub_(per_channel(sum_g / count)).mul_(per_channel(weight * invstd))
    return grad_input, sum_g_normalized if needs_weight else None, sum_g if needs_bias else None


class BatchNormFunction(torch.autograd.Function):
    """Batch norm, training mode: BatchNormFunction.apply(x, w, b, running_mean, running_var, momentum, eps).

    running_mean and running_var (or None for both) are updated in place, as F.batch_norm does."""

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean=None, running_var=None, momentum=0.1, eps=1e-5):
        check_bn_inputs(input, weight, bias, running_mean, running_var, momentum, eps)
        mean, var, invstd = batch_norm_statistics(input, eps)
        update_running_stats(running_mean, running_var, mean, var, input.numel() // input.shape[1], momentum)
        ctx.save_for_backward(input, weight, mean, invstd)  # as torch does: the input, not the normalized copy
        # One new full-size tensor (input - mean), then scaled and shifted in place.
        return (input - per_channel(mean)).mul_(per_channel(invstd * weight)).add_(per_channel(bias))

    @staticmethod
    @once_differentiable  # mean and invstd carry no history: refuse double backward (recipe 2)
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        normalized = (input - per_channel(mean)).mul_(per_channel(invstd))
        grads = batch_norm_backward(grad_output, normalized, weight, invstd, *ctx.needs_input_grad[:3])
        return (*grads, None, None, None, None)


# ---- 3. The fused Function: convolution then batch norm, the convolution recomputed in backward ----
class FusedConvBNFunction(torch.autograd.Function):
    """bn(conv2d(x, W)): FusedConvBNFunction.apply(x, W, w, b, padding, running_mean, running_var, momentum, eps).

    Saves x, W, w and two (C,) vectors; nn.Conv2d + nn.BatchNorm2d also save conv2d(x, W)."""

    @staticmethod
    def forward(ctx, input, conv_weight, bn_weight, bn_bias, padding=0, running_mean=None, running_var=None, momentum=0.1, eps=1e-5):
        ctx.padding = check_conv_inputs(input, conv_weight, padding)
        conv_output = conv2d_forward(input, conv_weight, ctx.padding)
        check_bn_inputs(conv_output, bn_weight, bn_bias, running_mean, running_var, momentum, eps)
        mean, var, invstd = batch_norm_statistics(conv_output, eps)
        update_running_stats(running_mean, running_var, mean, var, conv_output.numel() // conv_output.shape[1], momentum)
        ctx.save_for_backward(input, conv_weight, bn_weight, mean, invstd)  # not conv_output
        # Normalize in place: the convolution's output buffer becomes the output, no second one.
        output = conv_output.sub_(per_channel(mean)).mul_(per_channel(invstd * bn_weight)).add_(per_channel(bn_bias))
        return output

    @staticmethod
    @once_differentiable  # as BatchNormFunction: mean and invstd carry no history
    def backward(ctx, grad_output):
        input, conv_weight, bn_weight, mean, invstd = ctx.saved_tensors
        needs_input, needs_conv_weight, needs_bn_weight, needs_bn_bias = ctx.needs_input_grad[:4]
        needs_conv = needs_input or needs_conv_weight
        normalized = None
        if needs_conv or needs_bn_weight:
            # The price of the memory saved: the convolution once more, normalized in place.
            normalized = conv2d_forward(input, conv_weight, ctx.padding).sub_(per_channel(mean)).mul_(per_channel(invstd))
        grad_conv_output, grad_bn_weight, grad_bn_bias = batch_norm_backward(
            grad_output, normalized, bn_weight, invstd, needs_conv, needs_bn_weight, needs_bn_bias)
        del normalized  # now grad_conv_output's buffer (or unused): drop the second name
        grad_input = grad_conv_weight = None
        if needs_conv:
            grad_input, grad_conv_weight = conv2d_backward(grad_conv_output, input, conv_weight, ctx.padding, needs_input,
                                                           needs_conv_weight, getattr(ctx, "weight_grad_by_formula", False))
        return grad_input, grad_conv_weight, grad_bn_weight, grad_bn_bias, None, None, None, None, None


class FusedConvBNFunctionByFormula(FusedConvBNFunction):
    """The same fused Function, its weight gradient by conv2d_weight_grad_by_formula (for the memory script)."""

    @staticmethod
    def forward(ctx, *args):
        ctx.weight_grad_by_formula = True
        return FusedConvBNFunction.forward(ctx, *args)


# ---- 4. The module ----
class FusedConvBN(torch.nn.Module):
    """nn.Conv2d(in, out, k, padding=p, bias=False) followed by nn.BatchNorm2d(out), as one module.

    Owns conv_weight (out, in, kH, kW), bn_weight and bn_bias (out,), and, like nn.BatchNorm2d,
    the buffers running_mean, running_var and num_batches_tracked. Training mode (or
    track_running_stats=False) runs the custom Functions; eval mode normalizes with the running
    statistics through torch's own operators. fused=False runs Conv2dFunction then
    BatchNormFunction instead of the fused Function (same results; it also keeps the convolution's
    output for backward, so it holds more memory)."""

    function = FusedConvBNFunction  # the fused Function it applies (the memory script swaps in another)

    def __init__(self, in_channels, out_channels, kernel_size, padding=0, eps=1e-5, momentum=0.1,
                 track_running_stats=True, fused=True, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        kernel = check_pair(kernel_size, "kernel_size")
        if min(kernel) < 1 or min(in_channels, out_channels) < 1:
            raise ValueError(f"FusedConvBN: expected channels and kernel sizes >= 1, got {in_channels}, {out_channels}, {kernel_size!r}")
        if momentum is not None and not (0 <= momentum <= 1):
            raise ValueError(f"FusedConvBN: expected a momentum in [0, 1] or None (cumulative average), got {momentum!r}")
        self.padding, self.eps, self.momentum = check_pair(padding, "padding"), eps, momentum
        self.track_running_stats, self.fused = track_running_stats, fused
        self.conv_weight = torch.nn.Parameter(torch.empty(out_channels, in_channels, *kernel, **factory))
        self.bn_weight = torch.nn.Parameter(torch.ones(out_channels, **factory))
        self.bn_bias = torch.nn.Parameter(torch.zeros(out_channels, **factory))
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(out_channels, **factory))
            self.register_buffer("running_var", torch.ones(out_channels, **factory))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None
        # nn.Conv2d's initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        torch.nn.init.kaiming_uniform_(self.conv_weight, a=math.sqrt(5))

    @classmethod
    def from_modules(cls, conv, bn, fused=True):
        """A FusedConvBN with the parameters and statistics of an nn.Conv2d and an nn.BatchNorm2d."""
        if (conv.stride != (1, 1) or conv.dilation != (1, 1) or conv.groups != 1 or conv.bias is not None
                or conv.padding_mode != "zeros" or isinstance(conv.padding, str)):
            raise ValueError(f"FusedConvBN.from_modules: supports stride 1, no dilation, groups 1, no bias, numeric zero padding; got {conv}")
        if not bn.affine or bn.num_features != conv.out_channels:
            raise ValueError(f"FusedConvBN.from_modules: needs an affine BatchNorm2d over {conv.out_channels} channels, got {bn}")
        module = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.padding, bn.eps, bn.momentum,
                     bn.track_running_stats, fused, device=conv.weight.device, dtype=conv.weight.dtype)
        with torch.no_grad():
            module.conv_weight.copy_(conv.weight)
            module.bn_weight.copy_(bn.weight)
            module.bn_bias.copy_(bn.bias)
            if bn.track_running_stats:
                module.running_mean.copy_(bn.running_mean)
                module.running_var.copy_(bn.running_var)
                module.num_batches_tracked.copy_(bn.num_batches_tracked)
        return module

    def forward(self, input):
        if not (self.training or not self.track_running_stats):  # eval mode: a fixed affine map
            return F.batch_norm(F.conv2d(input, self.conv_weight, padding=self.padding), self.running_mean,
                                self.running_var, self.bn_weight, self.bn_bias, False, 0.0, self.eps)
        running_mean = running_var = None
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            running_mean, running_var = self.running_mean, self.running_var
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average, as nn.BatchNorm2d
                momentum = 1.0 / float(self.num_batches_tracked)
        if self.fused:
            return self.function.apply(input, self.conv_weight, self.bn_weight, self.bn_bias, self.padding,
                                             running_mean, running_var, momentum, self.eps)
        conv_output = Conv2dFunction.apply(input, self.conv_weight, self.padding)
        return BatchNormFunction.apply(conv_output, self.bn_weight, self.bn_bias, running_mean, running_var, momentum, self.eps)

    def extra_repr(self):
        out_channels, in_channels, *kernel = self.conv_weight.shape
        return (f"{in_channels}, {out_channels}, kernel_size={tuple(kernel)}, padding={self.padding}, eps={self.eps}, "
                f"momentum={self.momentum}, track_running_stats={self.track_running_stats}, fused={self.fused}")


# ---- 5. The tour's correctness line ----
@contextlib.contextmanager
def one_thread():
    """Run tiny checks on one thread: on a 2-core machine whose other core is busy, waking a second
    OpenMP thread for a 5x4 convolution costs far more than the convolution itself."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def compare_with_torch(fused=True, shape=(3, 2, 7, 6), out_channels=4, kernel_size=(3, 2), padding=1, steps=2, seed=0):
    """Max |error| of output, gradients and running statistics against nn.Conv2d + nn.BatchNorm2d
    in training mode, float64, after `steps` forward/backward passes on random inputs."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    conv = torch.nn.Conv2d(shape[1], out_channels, kernel_size, padding=padding, bias=False, dtype=torch.float64)
    bn = torch.nn.BatchNorm2d(out_channels, dtype=torch.float64)
    with torch.no_grad():  # a weight and bias other than 1 and 0, so that their gradients matter
        bn.weight.uniform_(0.5, 1.5, generator=generator)
        bn.bias.uniform_(-0.5, 0.5, generator=generator)
    module = FusedConvBN.from_modules(conv, bn, fused=fused)
    errors = {}
    for _ in range(steps):
        input = torch.randn(shape, dtype=torch.float64, generator=generator, requires_grad=True)
        expected, ours = bn(conv(input)), module(input)
        grad_output = torch.randn(expected.shape, dtype=torch.float64, generator=generator)
        want = torch.autograd.grad(expected, [input, conv.weight, bn.weight, bn.bias], grad_output)
        got = torch.autograd.grad(ours, [input, module.conv_weight, module.bn_weight, module.bn_bias], grad_output)
        pairs = {"out": (ours, expected), "dx": (got[0], want[0]), "dW": (got[1], want[1]), "dw_bn": (got[2], want[2]),
                 "db_bn": (got[3], want[3]), "running": (torch.cat([module.running_mean, module.running_var]),
                                                          torch.cat([bn.running_mean, bn.running_var]))}
        for name, (a, b) in pairs.items():
            errors[name] = max(errors.get(name, 0.0), (a - b).abs().max().item())
    return errors


def tour_check():
    """(ok, line): the fused module against torch's two modules, and gradcheck on the three Functions
    (fast mode, random projections of the Jacobian, to keep the tour quick; the tests run the full one)."""
    with one_thread():
        return _tour_check()


def _tour_check():
    errors = compare_with_torch(fused=True)
    generator = torch.Generator().manual_seed(1)

    def leaf(*shape):
        return torch.randn(shape, dtype=torch.float64, generator=generator, requires_grad=True)

    x, W, w, b, y = leaf(2, 2, 5, 4), leaf(3, 2, 3, 2), leaf(3), leaf(3), leaf(2, 3, 3, 3)
    verdicts = {
        "conv": torch.autograd.gradcheck(lambda x, W: Conv2dFunction.apply(x, W, 1), (x, W), raise_exception=False, fast_mode=True),
        "bn": torch.autograd.gradcheck(lambda y, w, b: BatchNormFunction.apply(y, w, b), (y, w, b), raise_exception=False, fast_mode=True),
        "fused": torch.autograd.gradcheck(lambda x, W, w, b: FusedConvBNFunction.apply(x, W, w, b, 1), (x, W, w, b), raise_exception=False, fast_mode=True),
    }
    worst = max(errors.values())
    ok = all(verdicts.values()) and worst < 1e-10
    text = "  ".join(f"{name} {value:.0e}" for name, value in errors.items())
    checks = ", ".join(f"{name} {'pass' if passed else 'FAIL'}" for name, passed in verdicts.items())
    return ok, f"vs nn.Conv2d+nn.BatchNorm2d float64 max|err|: {text}; gradcheck: {checks}"
