"""Stage 06's training step against the peak probe, product by product (README: "The training step").

    python 06_tpp/benchmark.py            # the large shapes below, 3 rounds
    python 06_tpp/benchmark.py --quick    # one shape, short
    python 06_tpp/benchmark.py --products # each product beside torch and numpy/OpenBLAS
    python 06_tpp/benchmark.py --blockings  # candidate blockings per product (how the default was chosen)
    python 06_tpp/benchmark.py --parts    # the training step beside the sum of its parts
    python 06_tpp/benchmark.py --step-ab 64,128,128  # the training step under the default blocking and this one

For each shape N x in x out: the forward alone (inference, packed weight cached), the
training step (forward + backward of input, weight and bias, the weight packed afresh, as
eml.common.timing times it), and each backward product alone (grad_input, grad_weight), as
GFLOP/s and as a share of the peak probe. Medians of interleaved rounds, all threads.

--products times each of the three products alone, as a share of the peak probe, for stage
06 and for the same product in torch (what torch.nn.Linear's forward and backward call:
F.linear, gy @ W, gy^T @ x) and in numpy (OpenBLAS): where does a hand-made layer lose?

--parts times the training step's parts in milliseconds: the forward with its packed weight
cached (a state of its own, so that the other statements do not drop the cache) and packing W
afresh (as training does), the backward of all three gradients, the two calls in a row from C++
(no autograd), the step through autograd, and torch.nn.Linear's step (F.linear, gy @ W, gy^T @ x,
the bias sum): does the step cost what its parts ("fwd packs W" + "backward") add up to?

--step-ab BM,BN,BK times the training step (through autograd, all threads) of one layer under
this CPU's default blocking and under the one given (all three products), switched by
state.set_config and interleaved in one process: a change of blocking measured without the drift
between two runs.

--blockings times each product under candidate blockings (bm, bn, bk) on one thread, in CPU
time, interleaved: the measurement behind the default blocking of this CPU's instruction set.

    python 06_tpp/benchmark.py --cpu-time # one thread, timed in CPU seconds

On a machine busy with other work, wall-clock timings measure the other work. --cpu-time runs
one thread and counts the CPU time this process got (time.process_time), for the peak probe
and the layer alike: the share of the peak stays meaningful while the machine is shared
(cache pollution by the other work still costs a little).
"""

import argparse
import statistics
import time

import torch
from torch.utils import benchmark

import numpy as np

from eml.common.numpy_linear import blas_name
from eml.common.timing import cpu_name
from eml.linear_tpp import Layer, _C, peak_gflops

SHAPES = [(2048, 1024, 1024), (1024, 4096, 1024), (1024, 1024, 4096), (512, 3072, 768)]
PRODUCTS = ("forward", "grad_input", "grad_weight")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu-time", action="store_true", help="one thread, timed in CPU seconds")
    parser.add_argument("--products", action="store_true", help="each product beside torch and numpy")
    parser.add_argument("--blockings", action="store_true", help="candidate blockings per product, one thread")
    parser.add_argument("--parts", action="store_true", help="the training step beside the sum of its parts")
    parser.add_argument("--step-ab", metavar="BM,BN,BK", help="the training step under the default blocking and this one")
    args = parser.parse_args()
    if args.step_ab:
        other = [int(v) for v in args.step_ab.split(",")]
        return step_ab(SHAPES[:1] if args.quick else SHAPES, 1 if args.quick else args.rounds + 2, other)
    if args.parts:
        return parts(SHAPES[:1] if args.quick else SHAPES, 1 if args.quick else args.rounds)
    if args.products:
        return products(SHAPES[:1] if args.quick else SHAPES, 1 if args.quick else args.rounds)
    if args.blockings:
        return blockings(SHAPES[:1] if args.quick else SHAPES, 1 if args.quick else args.rounds + 2)
    shapes, rounds, run_time = (SHAPES[:1], 1, 0.05) if args.quick else (SHAPES, args.rounds, 0.3)
    if args.cpu_time:
        torch.set_num_threads(1)
    threads = torch.get_num_threads()
    peak = cpu_time_peak() if args.cpu_time else peak_gflops()
    clock = "CPU time" if args.cpu_time else "wall clock"
    print(f"CPU: {cpu_name()}, {threads} threads, LIBXSMM target {_C.target_arch()}, {clock}; peak probe {peak:.1f} GFLOP/s")
    print(f"{'N x in x out':>16} {'fwd':>7} {'train':>7} {'g_in':>7} {'g_w':>7}   (GFLOP/s; % of peak below)")
    training_shares = []
    for n, i, o in shapes:
        torch.manual_seed(0)
        layer = Layer(i, o)
        x = torch.randn(n, i, requires_grad=True)
        gy = torch.randn(n, o)
        env = {"layer": layer, "x": x, "gy": gy, "torch": torch, "_C": _C, "w": layer.weight.detach(),
               "xd": x.detach(), "params": [x, *layer.parameters()]}
        statements = {
            "fwd": "with torch.no_grad(): layer(x)",
            "train": "torch.autograd.grad(layer(x), params, gy)",
            "g_in": "_C.backward(gy, None, w, True, False, False, layer.state)",
            "g_w": "_C.backward(gy, xd, None, False, True, False, layer.state)",
        }
        flops = {"fwd": 2 * n * i * o, "train": 6 * n * i * o, "g_in": 2 * n * i * o, "g_w": 2 * n * i * o}
        timers = {k: benchmark.Timer(s, globals=env, num_threads=threads) for k, s in statements.items()}
        times = {k: [] for k in statements}
        for _ in range(rounds):
            for k, timer in timers.items():
                if args.cpu_time:
                    times[k].append(cpu_seconds_per_call(compile(statements[k], k, "exec"), env, run_time))
                else:
                    times[k].extend(timer.blocked_autorange(min_run_time=run_time).times)
        gflops = {k: flops[k] / statistics.median(times[k]) * 1e-9 for k in statements}
        shape = "x".join(map(str, (n, i, o)))
        print(f"{shape:>16} " + " ".join(f"{gflops[k]:>7.1f}" for k in statements))
        print(f"{'':>16} " + " ".join(f"{100 * gflops[k] / peak:>6.0f}%" for k in statements))
        training_shares.append(gflops["train"] / peak)
    print(f"training step: median {100 * statistics.median(training_shares):.0f}% of the peak probe"
          f" (worst {100 * min(training_shares):.0f}%)")


def products(shapes, rounds):
    """Each product alone, stage 06 beside torch and numpy, as GFLOP/s and % of the peak probe."""
    threads = torch.get_num_threads()
    peak = peak_gflops()
    print(f"CPU: {cpu_name()}, {threads} threads, LIBXSMM target {_C.target_arch()}, wall clock; "
          f"peak probe {peak:.1f} GFLOP/s; numpy: {blas_name()}")
    blocking = Layer(1, 1).state.config
    print("stage 06 blocking (bm, bn, bk; bk 0 = whole K): " +
          ", ".join(f"{name} {tuple(b)}" for name, b in zip(("forward", "grad_input", "grad_weight"), blocking[:3])))
    names = PRODUCTS
    print(f"{'N x in x out':>16} {'product':>12} {'06 GF/s':>8} {'torch':>8} {'numpy':>8} {'06 %pk':>7} {'torch %pk':>9}"
          f" {'numpy %pk':>9} {'06/torch':>8}")
    shares = {(who, name): [] for who in ("06", "torch", "numpy") for name in names}
    for n, i, o in shapes:
        torch.manual_seed(0)
        layer = Layer(i, o)
        x, gy = torch.randn(n, i), torch.randn(n, o)
        w, b = layer.weight.detach(), layer.bias.detach()
        env = {"_C": _C, "torch": torch, "np": np, "state": layer.state, "x": x, "w": w, "b": b, "gy": gy,
               "xn": x.numpy(), "wn": w.numpy(), "bn": b.numpy(), "gyn": gy.numpy()}
        statements = {  # each product as stage 06, torch.nn.Linear and numpy compute it
            ("06", "forward"): "_C.forward(x, w, b, state, True)",
            ("06", "grad_input"): "_C.backward(gy, None, w, True, False, False, state)",
            ("06", "grad_weight"): "_C.backward(gy, x, None, False, True, True, state)",
            ("torch", "forward"): "torch.nn.functional.linear(x, w, b)",
            ("torch", "grad_input"): "gy.mm(w)",
            ("torch", "grad_weight"): "(gy.t().mm(x), gy.sum(0))",
            ("numpy", "forward"): "xn @ wn.T + bn",
            ("numpy", "grad_input"): "gyn @ wn",
            ("numpy", "grad_weight"): "(gyn.T @ xn, gyn.sum(0))",
        }
        timers = {k: benchmark.Timer(s, globals=env, num_threads=threads) for k, s in statements.items()}
        times = {k: [] for k in statements}
        for _ in range(rounds):  # interleaved: every product of every library, then again
            for k, timer in timers.items():
                times[k].extend(timer.blocked_autorange(min_run_time=0.2).times)
        for name in names:
            gflops = {who: 2 * n * i * o / statistics.median(times[(who, name)]) * 1e-9 for who in ("06", "torch", "numpy")}
            for who, g in gflops.items():
                shares[(who, name)].append(g / peak)
            shape = "x".join(map(str, (n, i, o))) if name == "forward" else ""
            print(f"{shape:>16} {name:>12} {gflops['06']:>8.1f} {gflops['torch']:>8.1f} {gflops['numpy']:>8.1f}"
                  f" {100 * gflops['06'] / peak:>6.0f}% {100 * gflops['torch'] / peak:>8.0f}%"
                  f" {100 * gflops['numpy'] / peak:>8.0f}% {gflops['06'] / gflops['torch']:>7.2f}x")
    print("median share of the peak probe over these shapes:")
    for name in names:
        print(f"  {name:>12}: stage 06 {100 * statistics.median(shares[('06', name)]):.0f}%,"
              f" torch {100 * statistics.median(shares[('torch', name)]):.0f}%,"
              f" numpy {100 * statistics.median(shares[('numpy', name)]):.0f}%")


def parts(shapes, rounds):
    """The training step and its parts, in ms per call (medians of interleaved rounds), all threads."""
    threads = torch.get_num_threads()
    peak = peak_gflops()
    print(f"CPU: {cpu_name()}, {threads} threads, LIBXSMM target {_C.target_arch()}, wall clock; "
          f"peak probe {peak:.1f} GFLOP/s; ms per call")
    statements = {
        "fwd cached": "_C.forward(x, w, b, cached, True)",
        "fwd packs W": "_C.forward(x, w, b, state, False)",
        "backward": "_C.backward(gy, x, w, True, True, True, state)",
        "C++ step": "_C.forward(x, w, b, state, False); _C.backward(gy, x, w, True, True, True, state)",
        "step": "torch.autograd.grad(layer(xg), params, gy)",
        "torch step": "F.linear(x, w, b); gy.mm(w); gy.t().mm(x); gy.sum(0)",
    }
    print(f"{'N x in x out':>16} " + " ".join(f"{k:>11}" for k in statements) + f" {'step %pk':>9}")
    for n, i, o in shapes:
        torch.manual_seed(0)
        layer = Layer(i, o)
        xg = torch.randn(n, i, requires_grad=True)
        env = {"_C": _C, "torch": torch, "F": torch.nn.functional, "layer": layer, "state": layer.state,
               "cached": _C.LinearState(i, o), "xg": xg,
               "x": xg.detach(), "w": layer.weight.detach(), "b": layer.bias.detach(), "gy": torch.randn(n, o),
               "params": [xg, *layer.parameters()]}
        timers = {k: benchmark.Timer(s, globals=env, num_threads=threads) for k, s in statements.items()}
        times = {k: [] for k in statements}
        for _ in range(rounds):  # interleaved: every part, then again
            for k, timer in timers.items():
                times[k].extend(timer.blocked_autorange(min_run_time=0.3).times)
        ms = {k: 1e3 * statistics.median(t) for k, t in times.items()}
        share = 6 * n * i * o / (ms["step"] * 1e-3) * 1e-9 / peak
        shape = "x".join(map(str, (n, i, o)))
        print(f"{shape:>16} " + " ".join(f"{ms[k]:>11.2f}" for k in statements) + f" {100 * share:>8.0f}%")


def step_ab(shapes, rounds, other):
    """The training step of one layer under the default blocking and under other, interleaved."""
    threads = torch.get_num_threads()
    default = [list(b) for b in Layer(1, 1).state.config[:3]]
    print(f"CPU: {cpu_name()}, {threads} threads, LIBXSMM target {_C.target_arch()}, wall clock; training step "
          f"(autograd), median of {rounds} interleaved rounds; A: default {default}, B: {other} for all three products")
    print(f"{'N x in x out':>16} {'A ms':>8} {'B ms':>8} {'torch ms':>8} {'B vs A':>7} {'A vs torch':>10} {'B vs torch':>10}"
          "   (x: speed-up)")
    for n, i, o in shapes:
        torch.manual_seed(0)
        layer, linear = Layer(i, o), torch.nn.Linear(i, o)
        x, gy = torch.randn(n, i, requires_grad=True), torch.randn(n, o)
        configs = {"A": default, "B": [other] * 3}
        times = {k: [] for k in ("A", "B", "torch")}
        for _ in range(rounds):
            for k in times:
                if k != "torch":
                    layer.state.set_config(*configs[k], layer.state.config[3])
                timer = benchmark.Timer("m(x).backward(gy)", globals={"m": linear if k == "torch" else layer,
                                                                     "x": x, "gy": gy}, num_threads=threads)
                times[k].append(timer.blocked_autorange(min_run_time=0.3).median)
        ms = {k: 1e3 * statistics.median(t) for k, t in times.items()}
        shape = "x".join(map(str, (n, i, o)))
        print(f"{shape:>16} {ms['A']:>8.2f} {ms['B']:>8.2f} {ms['torch']:>8.2f} {ms['A'] / ms['B']:>6.2f}x"
              f" {ms['torch'] / ms['A']:>9.2f}x {ms['torch'] / ms['B']:>9.2f}x", flush=True)


# (bm, bn, bk) candidates for --blockings; bk 0 = the whole K in one step.
CANDIDATE_BLOCKINGS = [(64, 64, 0), (64, 64, 128), (32, 128, 128), (64, 128, 128), (64, 128, 64), (96, 128, 64),
                       (32, 256, 128), (32, 128, 256), (128, 64, 128), (128, 32, 256), (128, 64, 256)]


def blockings(shapes, rounds):
    """Each product under each candidate blocking, one thread, % of the one-thread peak (CPU time)."""
    torch.set_num_threads(1)
    peak = cpu_time_peak()
    default = Layer(1, 1).state.config
    print(f"CPU: {cpu_name()}, 1 thread, LIBXSMM target {_C.target_arch()}, CPU time; peak probe {peak:.1f} GFLOP/s")
    print("default blocking: " + ", ".join(f"{name} {tuple(b)}" for name, b in zip(PRODUCTS, default[:3])))
    print(f"{'N x in x out':>16} {'product':>12} {'torch':>6} " + " ".join(f"{str(c):>15}" for c in CANDIDATE_BLOCKINGS))
    for n, i, o in shapes:
        torch.manual_seed(0)
        x, gy, w = torch.randn(n, i), torch.randn(n, o), torch.randn(o, i)
        for p, name in enumerate(PRODUCTS):
            calls = {"torch": {"forward": lambda: torch.nn.functional.linear(x, w), "grad_input": lambda: gy.mm(w),
                               "grad_weight": lambda: gy.t().mm(x)}[name]}
            for candidate in CANDIDATE_BLOCKINGS:
                state = _C.LinearState(i, o)
                config = [list(b) for b in state.config[:3]]
                config[p] = list(candidate)
                state.set_config(*config, state.config[3])
                calls[candidate] = {
                    "forward": lambda s=state: _C.forward(x, w, None, s, True),
                    "grad_input": lambda s=state: _C.backward(gy, None, w, True, False, False, s),
                    "grad_weight": lambda s=state: _C.backward(gy, x, None, False, True, False, s)}[name]
            times = {k: [] for k in calls}
            for _ in range(rounds):  # interleaved: every candidate, then again
                for k, call in calls.items():
                    times[k].append(cpu_seconds_per_call(call, None, 0.15))
            shares = {k: 2 * n * i * o / statistics.median(t) * 1e-9 / peak for k, t in times.items()}
            shape = "x".join(map(str, (n, i, o))) if p == 0 else ""
            print(f"{shape:>16} {name:>12} {100 * shares['torch']:>5.0f}% " +
                  " ".join(f"{100 * shares[c]:>14.0f}%" for c in CANDIDATE_BLOCKINGS), flush=True)


def cpu_time_peak(repeats=3, seconds=0.2):
    """The peak probe on this one thread, per CPU second: the probe's FLOPs over the CPU time it got."""
    _C.peak_gflops(seconds=0.01)
    best = 0.0
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        gflops = _C.peak_gflops(64, 64, 64, seconds)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        best = max(best, gflops * wall / cpu)  # GFLOP done / CPU seconds
    return best


def cpu_seconds_per_call(code, env, run_time):
    """CPU seconds per call of code: compiled source run in env, or a callable (env None)."""
    call = code if env is None else (lambda: exec(code, env))
    call()  # warm-up
    calls, start = 0, time.process_time()
    while time.process_time() - start < run_time or calls < 2:
        call()
        calls += 1
    return (time.process_time() - start) / calls


if __name__ == "__main__":
    main()
