"""Side-by-side timing of linear layers on torch.utils.benchmark.

Every layer is timed in the same process, on the same input and the same weights, in
interleaved rounds (round 1: every layer, round 2: every layer, ...) so that a slow drift of
the machine (another process, the clock) hits all of them alike. Reported: the median over
all measured blocks (a round is blocked_autorange's blocks of calls until min_run_time is spent)
and the spread (interquartile range relative to the median; with fewer than 4 blocks, the range,
max - min, relative to the median; none for a single value). A call that alone outlasts
min_run_time is timed once per round, as one value (timed_blocks), and one that lasts over
ONE_ROUND_S is timed in the first round only (interleaved).

FLOPs: one GEMM of an (N x in) input with an (in x out) weight costs 2*N*in*out.
The forward pass is one GEMM; forward+backward is three (output, grad_input, grad_weight).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time

import torch
from torch.utils import benchmark

# N x in_features x out_features, the tour's benchmark shapes.
BENCHMARK_SHAPES = [(64, 256, 256), (256, 1024, 1024), (512, 768, 3072), (512, 3072, 768)]

# The tour's timing settings (notebooks use the same): interleaved rounds per shape, and the
# least seconds of each round (blocked_autorange's min_run_time: blocks of calls until it is
# spent). EML_QUICK_TIMING=1, which `make test` sets, times one short round: nbval ignores the
# notebooks' timing output, so there the timing code must run, not measure.
TOUR_SETTINGS = (dict(rounds=1, min_run_time=0.01) if os.environ.get("EML_QUICK_TIMING")
                 else dict(rounds=3, min_run_time=0.2))


def cpu_name():
    """The CPU as /proc/cpuinfo names it, with its family, model and widest vector extension,
    e.g. "AMD EPYC (family 25, model 1, AVX2)". Machines of one name differ (Zen 3, 4 and 5 all
    call themselves "AMD EPYC", with float32 peaks up to 3x apart), so every figure is printed beside this."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "flags" not in fields:  # not x86 (an Arm CPU lists "Features"): no family or vector names
        return name
    flags = fields["flags"].split()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}, {vector})"


def gemm_flops(n, in_features, out_features):
    return 2 * n * in_features * out_features


@dataclasses.dataclass
class Timing:
    label: str
    shape: tuple
    forward_us: float
    forward_spread: float | None   # IQR / median (range / median below 4 samples; None for 1)
    training_us: float             # forward + backward
    training_spread: float | None

    @property
    def forward_gflops(self):
        return gemm_flops(*self.shape) / self.forward_us / 1e3

    @property
    def training_gflops(self):
        return 3 * gemm_flops(*self.shape) / self.training_us / 1e3


def _median_and_spread(times):
    times = sorted(times)
    median = statistics.median(times)
    if len(times) == 1:
        return median, None
    if len(times) < 4:
        return median, (times[-1] - times[0]) / median
    quartiles = statistics.quantiles(times, n=4)
    return median, (quartiles[2] - quartiles[0]) / median


def timed_blocks(call, min_run_time, num_threads):
    """Seconds per call of ``call()``, one value per timed block, on ``num_threads`` threads.

    torch.utils.benchmark's ``blocked_autorange`` first runs a statement to choose how many calls
    make a block, then runs blocks until ``min_run_time`` is spent: a call that alone outlasts
    min_run_time runs twice for one value. Such calls take seconds here (the textbook loops at the
    large shapes, bfloat16 on a CPU without bf16 kernels), so ``call()`` is run once first: when that
    one call outlasts min_run_time it is the value; otherwise it was the warm-up, and
    blocked_autorange times the call.
    """
    with benchmark.utils.common.set_torch_threads(num_threads):
        start = time.perf_counter()
        call()
        seconds = time.perf_counter() - start
    if seconds >= min_run_time:
        return [seconds]
    timer = benchmark.Timer("call()", globals={"call": call}, num_threads=num_threads)
    return timer.blocked_autorange(min_run_time=min_run_time).times


# A call slower than this (stage 05's textbook loops on the large shapes, bf16 torch.nn.Linear's
# backward on a CPU without bf16 kernels: tens to a hundred times the rows beside it, over a second
# on the slower CPUs) is timed in the
# first round only: two more rounds of it would add tens of seconds to the tour and nothing to
# what its row says.
ONE_ROUND_S = 1.0


def interleaved(calls: dict, rounds, min_run_time, num_threads):
    """Seconds per call of each ``calls[key]()`` over interleaved rounds (round 1: every call,
    round 2: every call, ...), one value per timed block (timed_blocks); a call whose first
    round took over ONE_ROUND_S per call is not timed again. Returns {key: [seconds, ...]}."""
    samples = {key: [] for key in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            if samples[key] and min(samples[key]) > ONE_ROUND_S:
                continue
            samples[key] += timed_blocks(call, min_run_time, num_threads)
    return samples


def inference_call(module, input):
    """A call of module(input) under torch.no_grad(), to time an inference forward."""
    def forward():
        with torch.no_grad():
            module(input)
    return forward


def _training_call(layer, input, grad_output):
    params = [input, *layer.parameters()]
    return lambda: torch.autograd.grad(layer(input), params, grad_output)


def time_layers(makers: dict, shape, *, dtype=torch.float32, rounds=3, min_run_time=0.1, seed=0):
    """Time each ``makers[label](in, out)`` layer on one (N, in, out) shape.

    All layers get the same weights (those of a torch.nn.Linear) and the same input.
    Forward is timed under ``torch.no_grad()`` (inference); forward+backward computes the
    gradients of input, weight and bias with ``torch.autograd.grad`` (one training step of
    the layer, without accumulating into ``.grad``). Returns one Timing per label.
    """
    n, in_features, out_features = shape
    torch.manual_seed(seed)
    reference = torch.nn.Linear(in_features, out_features).to(dtype)
    input = torch.randn(n, in_features, dtype=dtype, requires_grad=True)
    grad_output = torch.randn(n, out_features, dtype=dtype)

    # torch.utils.benchmark.Timer runs on ONE thread unless told otherwise: time every layer
    # with the threads the process has (all its cores, by torch's default), as a training loop would run.
    threads = torch.get_num_threads()
    calls = {}
    for label, make in makers.items():
        layer = make(in_features, out_features).to(dtype)
        layer.load_state_dict(reference.state_dict())
        calls[label, "forward"] = inference_call(layer, input)
        calls[label, "training"] = _training_call(layer, input, grad_output)
    samples = interleaved(calls, rounds, min_run_time, threads)

    results = []
    for label in makers:
        forward_us, forward_spread = _median_and_spread([t * 1e6 for t in samples[label, "forward"]])
        training_us, training_spread = _median_and_spread([t * 1e6 for t in samples[label, "training"]])
        results.append(Timing(label, tuple(shape), forward_us, forward_spread, training_us, training_spread))
    return results


def _percent(spread):
    return "-" if spread is None else f"{100 * spread:.0f}"


def format_table(timings, baseline_label, peak_gflops=None):
    """A text table: one row per (shape, layer); speed-ups are relative to baseline_label.

    The +-% columns are each timing's spread, its interquartile range over the median (its range
    below 4 samples, "-" for a single one): a speed-up smaller than the two rows' spreads is no
    speed-up."""
    header = (f"{'stage':<22} {'N x in x out':>16} {'fwd us':>10} {'+-%':>4} {'fwd+bwd us':>11} {'+-%':>4}"
              f" {'fwd GF/s':>9} {'f+b GF/s':>9}")
    if peak_gflops:
        header += f" {'fwd %pk':>7} {'f+b %pk':>7}"
    header += f" {'fwd x':>6} {'f+b x':>6}"
    lines = [header, "-" * len(header)]
    baselines = {t.shape: t for t in timings if t.label == baseline_label}
    previous_shape = None
    for t in timings:
        if previous_shape is not None and t.shape != previous_shape:
            lines.append("")
        previous_shape = t.shape
        base = baselines.get(t.shape)
        shape = "x".join(str(s) for s in t.shape)
        row = (f"{t.label:<22} {shape:>16} {t.forward_us:>10.1f} {_percent(t.forward_spread):>4}"
               f" {t.training_us:>11.1f} {_percent(t.training_spread):>4}"
               f" {t.forward_gflops:>9.1f} {t.training_gflops:>9.1f}")
        if peak_gflops:
            row += f" {100 * t.forward_gflops / peak_gflops:>6.0f}% {100 * t.training_gflops / peak_gflops:>6.0f}%"
        if base is not None:
            row += f" {base.forward_us / t.forward_us:>6.2f} {base.training_us / t.training_us:>6.2f}"
        lines.append(row)
    return "\n".join(lines)


def plot_gflops(timings, ax=None, which="training", peak_gflops=None):
    """Grouped bars: GFLOP/s per layer, one group per shape (matplotlib)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4))
    labels = list(dict.fromkeys(t.label for t in timings))
    shapes = list(dict.fromkeys(t.shape for t in timings))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        values = [next(getattr(t, f"{which}_gflops") for t in timings if t.label == label and t.shape == s) for s in shapes]
        ax.bar([j + i * width for j in range(len(shapes))], values, width, label=label)
    ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(shapes))])
    ax.set_xticklabels(["x".join(map(str, s)) for s in shapes])
    ax.set_xlabel("N x in_features x out_features")
    ax.set_ylabel(f"{'forward+backward' if which == 'training' else 'forward'} GFLOP/s")
    if peak_gflops:
        ax.axhline(peak_gflops, color="k", linestyle="--", linewidth=1, label="peak probe")
    ax.legend(fontsize="small")
    return ax
