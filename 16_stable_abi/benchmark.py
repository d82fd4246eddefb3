"""Stage 16 against stage 08: what the stable ABI costs (README, "08 against 16").

    python 16_stable_abi/benchmark.py            # needs stages 08 and 16 installed
    python 16_stable_abi/benchmark.py --quick
    python 16_stable_abi/benchmark.py --build    # also: each stage's C++ built from scratch

The two stages run the same LIBXSMM kernels and loop nest; what differs is how the C++ reaches
libtorch. 08 calls ATen's C++ API: each tensor operation an unboxed call through an operator
handle ATen looked up once; 16 calls the stable C shim, where every tensor operation (contiguous,
flatten, empty, reshape, to) is a boxed call: its arguments packed into StableIValues, the
operator looked up by name, handles allocated for the results. So the difference shows per
call, not per FLOP:

  1. Overhead per call, on a small shape: the forward op entered below autograd (the C++ kernel
     alone: its checks, shim calls and the GEMM) and through the Layer under no_grad, and a
     training step of the Layer; medians of interleaved rounds.
  2. The Layer's forward and training step on the tour's shapes, with torch.nn.Linear beside
     them (common's time_layers: interleaved rounds, medians, the spread of each).
  3. With --build: `python setup.py build_ext` of each stage from scratch, in a copy of its
     folder (ninja, every core), wall-clock seconds: what the two sets of headers cost to compile.

Run it on an idle machine: every figure is a median of interleaved repeats, on --threads
threads (default: torch.get_num_threads()).
"""

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils import benchmark

import eml.linear_op
import eml.linear_stable
from eml.common import timing
from eml.common.tour import cpu_name

SMALL_SHAPES = [(1, 64, 64), (16, 128, 128)]
ROOT = pathlib.Path(__file__).resolve().parents[1]


def overhead(shape, rounds, min_run_time, threads):
    """Median us per call of each statement, 08's and 16's interleaved."""
    n, n_in, n_out = shape
    x, w, b = torch.randn(n, n_in), torch.randn(n_out, n_in), torch.randn(n_out)
    x_grad = x.clone().requires_grad_()
    statements = {}
    for stage, package, namespace in (("08", eml.linear_op, "eml"), ("16", eml.linear_stable, "eml_stable")):
        layer = package.Layer(n_in, n_out)
        env = {"torch": torch, "x": x, "x_grad": x_grad, "w": w, "b": b, "layer": layer,
               "params": [x_grad, *layer.parameters()], "op": getattr(torch.ops, namespace).linear.default}
        statements[stage] = {
            "kernel": ("with torch._C._AutoDispatchBelowAutograd(): op(x, w, b)", env),
            "layer fwd": ("with torch.no_grad(): layer(x)", env),
            "layer fwd+bwd": ("torch.autograd.grad(layer(x_grad).sum(), params)", env),
        }
    timers = {(stage, what): benchmark.Timer(stmt, globals=env, num_threads=threads)
              for stage, table in statements.items() for what, (stmt, env) in table.items()}
    times = {key: [] for key in timers}
    for timer in timers.values():
        timer.timeit(3)  # warm-up: kernels, plans
    for _ in range(rounds):
        for key, timer in timers.items():
            times[key] += [t * 1e6 for t in timer.blocked_autorange(min_run_time=min_run_time).times]
    return {key: statistics.median(values) for key, values in times.items()}


def build_seconds(stage):
    """Wall-clock seconds of `python setup.py build_ext` for a copy of the stage, from scratch."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = pathlib.Path(scratch) / stage
        shutil.copytree(ROOT / stage, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}", PYTHONWARNINGS="ignore")
        start = time.perf_counter()
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext"], cwd=copy, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one shape of each kind, short timings")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="threads to time on")
    parser.add_argument("--build", action="store_true", help="also time each stage's C++ build from scratch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    rounds, min_run_time = (1, 0.05) if args.quick else (5, 0.2)
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, {threads} threads; LIBXSMM target "
          f"{eml.linear_stable.ops.ops.tpp_target_arch()}")

    print(f"\n1. Overhead per call, median us of {rounds} interleaved rounds (float32)")
    print(f"{'N x in x out':>14s} {'what':>14s} {'08':>8s} {'16':>8s} {'16 - 08':>8s}")
    for shape in SMALL_SHAPES[:1] if args.quick else SMALL_SHAPES:
        us = overhead(shape, rounds, min_run_time, threads)
        for what in ("kernel", "layer fwd", "layer fwd+bwd"):
            a, b = us[("08", what)], us[("16", what)]
            print(f"{'x'.join(map(str, shape)):>14s} {what:>14s} {a:8.1f} {b:8.1f} {b - a:8.1f}")

    shapes = timing.BENCHMARK_SHAPES[:2] if args.quick else timing.BENCHMARK_SHAPES
    # More rounds than the tour's 3: the two stages differ by microseconds, and on two cores a
    # training step of milliseconds moves by 10-30 % from one round to the next.
    layer_rounds, layer_time = (1, min_run_time) if args.quick else (6, 0.2)
    print(f"\n2. The Layer on the tour's shapes, median us of {layer_rounds} interleaved rounds (float32)")
    makers = {"torch.nn.Linear": torch.nn.Linear, "08 custom op": eml.linear_op.Layer,
              "16 stable ABI": eml.linear_stable.Layer}
    timings = []
    for shape in shapes:
        timings += timing.time_layers(makers, shape, rounds=layer_rounds, min_run_time=layer_time)
    print(timing.format_table(timings, "08 custom op"))
    print("(fwd x, f+b x: speed relative to stage 08)")

    if args.build:
        print(f"\n3. python setup.py build_ext from scratch, {os.cpu_count()} cores, wall clock")
        for stage in ("08_custom_op", "16_stable_abi"):
            print(f"  {stage:14s} {build_seconds(stage):6.1f} s", flush=True)


if __name__ == "__main__":
    main()
