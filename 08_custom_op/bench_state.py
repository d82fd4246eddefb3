"""Stage 08: what each way of keeping the layer's state costs (README, "State without pybind11").

    python 08_custom_op/bench_state.py            # needs stages 06 and 08 installed
    python 08_custom_op/bench_state.py --quick

A registered operator's schema has no type for a pybind11 object, so stage 06's per-layer state
(JIT kernels, plans, packed weight) cannot be passed to it. The candidates, timed on the same
C++ (stage 06's functions expose every variant through their state and cache_weight arguments):

    A  08's op: process-wide state per (in, out), weight packed every call   torch.ops.eml.linear.default
    A0 the same op entered below autograd: without register_autograd's Python kernel
    B  06, a state per layer, weight packed every call                      _C.forward(.., state, False)
    C  06, a state per layer, pack cached while the weight is unchanged     _C.forward(.., state, True)
    D  no state kept at all: kernels looked up and plans built every call   _C.forward(.., None, False)

so that A - B is what the dispatcher, the Python autograd kernel and the process-wide table
cost against a pybind11 call (A0 - B: without the Python autograd kernel), B - C is what packing the weight costs per call, and D - B what a kept state saves. Forward
only, under no_grad (inference: where a pack cache can help at all; in training 06 packs the
weight every step too), float32, medians of interleaved rounds, on --threads threads (default:
torch.get_num_threads()).
"""

import argparse
import statistics

import torch
from torch.utils import benchmark

import eml.linear_op  # noqa: F401  registers torch.ops.eml
from eml.common.tour import cpu_name
from eml.linear_tpp import _C as stage06

SHAPES = [(1, 64, 64), (64, 256, 256), (256, 1024, 1024), (512, 3072, 768)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two shapes, short timings")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="threads to time on")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = SHAPES[:2] if args.quick else SHAPES
    rounds, min_run_time = (1, 0.05) if args.quick else (5, 0.2)
    threads = torch.get_num_threads()
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, {threads} threads; forward under no_grad, float32, "
          f"median us of {rounds} interleaved rounds")
    print(f"{'N x in x out':>16s} {'A: 08 op':>9s} {'A0: below':>10s} {'B: 06 state':>12s} {'C: 06 cache':>12s}"
          f" {'D: no state':>12s} {'A-B':>7s} {'A0-B':>7s} {'B-C pack':>9s} {'D-B':>7s}")
    for n, n_in, n_out in shapes:
        x, w, b = torch.randn(n, n_in), torch.randn(n_out, n_in), torch.randn(n_out)
        state = stage06.LinearState(n_in, n_out)
        env = {"torch": torch, "x": x, "w": w, "b": b, "state": state, "c06": stage06}
        statements = {
            "A": "torch.ops.eml.linear.default(x, w, b)",
            "A0": "with torch._C._AutoDispatchBelowAutograd(): torch.ops.eml.linear.default(x, w, b)",
            "B": "c06.forward(x, w, b, state, False)",
            "C": "c06.forward(x, w, b, state, True)",
            "D": "c06.forward(x, w, b, None, False)",
        }
        timers = {k: benchmark.Timer(s, globals=env, num_threads=threads) for k, s in statements.items()}
        times = {k: [] for k in timers}
        with torch.no_grad():
            for k in timers:  # warm-up: kernels, plans, the first pack
                timers[k].timeit(3)
            for _ in range(rounds):
                for k, timer in timers.items():
                    times[k] += [t * 1e6 for t in timer.blocked_autorange(min_run_time=min_run_time).times]
        us = {k: statistics.median(v) for k, v in times.items()}
        print(f"{f'{n}x{n_in}x{n_out}':>16s} {us['A']:9.1f} {us['A0']:10.1f} {us['B']:12.1f} {us['C']:12.1f}"
              f" {us['D']:12.1f} {us['A'] - us['B']:7.1f} {us['A0'] - us['B']:7.1f} {us['B'] - us['C']:9.1f}"
              f" {us['D'] - us['B']:7.1f}")


if __name__ == "__main__":
    main()
