"""Stage 13: what one call through ctypes costs, next to torch's own add (the README's figures).

What this stage teaches: the price of the ctypes route is paid per call, in Python: checks,
``data_ptr()``, argument conversion, the foreign call. On a tiny tensor that is all there is;
on a large one the C loop's own speed decides.
Run it: ``python -m eml.c_ffi.bench`` (prints the CPU; numbers vary with the machine's load).
"""

from __future__ import annotations

import torch
from torch.utils import benchmark

from . import clib, layer, ops
from .layer import AddFunction


def cpu_name() -> str:
    fields = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')})"


def measure(sizes=(1, 1 << 20), min_run_time=0.3):
    """Median microseconds per call of each route, for each element count."""
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
        for label, fn in routes.items():
            timer = benchmark.Timer("fn(a, b)", globals={"fn": fn, "a": a, "b": b}, num_threads=1)
            rows.append((n, label, timer.blocked_autorange(min_run_time=min_run_time).median * 1e6))
    return rows


def main():
    print(f"CPU: {cpu_name()}, torch {torch.__version__}, 1 thread; median us per call")
    for n, label, us in measure():
        print(f"  n = {n:>8}  {label:<34} {us:10.2f} us")


if __name__ == "__main__":
    main()
