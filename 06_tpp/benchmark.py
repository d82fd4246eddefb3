"""Stage 06's training step against the peak probe, product by product (README: "The training step").

    python 06_tpp/benchmark.py            # the large shapes below, 3 rounds
    python 06_tpp/benchmark.py --quick    # one shape, short

For each shape N x in x out: the forward alone (inference, packed weight cached), the
training step (forward + backward of input, weight and bias, the weight packed afresh, as
eml.common.timing times it), and each backward product alone (grad_input, grad_weight), as
GFLOP/s and as a share of the peak probe. Medians of interleaved rounds, all threads.

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

from eml.common.tour import cpu_name
from eml.linear_tpp import Layer, _C, peak_gflops

SHAPES = [(2048, 1024, 1024), (1024, 4096, 1024), (1024, 1024, 4096), (512, 3072, 768)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu-time", action="store_true", help="one thread, timed in CPU seconds")
    args = parser.parse_args()
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
    exec(code, env)  # warm-up
    calls, start = 0, time.process_time()
    while time.process_time() - start < run_time or calls < 2:
        exec(code, env)
        calls += 1
    return (time.process_time() - start) / calls


if __name__ == "__main__":
    main()
