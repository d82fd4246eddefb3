"""Stage 13: what one call through ctypes costs, next to torch's own add (the README's figures).

What this stage teaches: the price of the ctypes route is paid per call, in Python: checks,
``data_ptr()``, argument conversion, the foreign call. On a tiny tensor that is all there is;
on a large one the C loop's own speed decides.
What changed: a new route, not a copy of an earlier stage (README).
Run it: ``python -m eml.c_ffi.bench`` (prints the CPU; numbers vary with the machine's load).
"""

from __future__ import annotations

import statistics

import torch
from torch.utils import benchmark

from eml.common.timing import cpu_name  # family, model and vector extension: the CPU to name beside a figure

from . import clib, layer, ops
from .layer import AddFunction


def measure(sizes=(1, 1 << 20), rounds=5, min_run_time=0.05):
    """Median microseconds per call of each route, for each element count.

    The routes are timed in interleaved rounds (round 1: every route, round 2: every route, ...)
    so that a change in the machine's load hits all of them alike; the median over the rounds.
    """
    routes = {
        "torch.add (ATen)": lambda a, b: torch.add(a, b),
        "clib.add_forward (ctypes, raw)": clib.add_forward,
        "layer.add (+ checks, contiguous)": layer.add,
        "AddFunction.apply (+ autograd)": AddFunction.apply,
        "ops.add (torch.library op)": ops.add,
    }
    rows = []
    for n in sizes:
        a, b = torch.randn(n), torch.randn(n)
        times = {label: [] for label in routes}
        for _ in range(rounds):
            for label, fn in routes.items():
                timer = benchmark.Timer("fn(a, b)", globals={"fn": fn, "a": a, "b": b}, num_threads=1)
                times[label].append(timer.blocked_autorange(min_run_time=min_run_time).median)
        rows += [(n, label, statistics.median(t) * 1e6) for label, t in times.items()]
    return rows


def main():
    print(f"CPU: {cpu_name()}, torch {torch.__version__}, 1 thread; median us per call over 5 interleaved rounds")
    for n, label, us in measure():
        print(f"  n = {n:>8}  {label:<34} {us:10.2f} us")


if __name__ == "__main__":
    main()
