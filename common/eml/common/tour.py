"""The tour: every installed stage, checked and timed against torch.nn.Linear.

    python -m eml.common.tour            # what `make` runs after installing the stages
    python -m eml.common.tour --quick    # one shape, short timings (a smoke test)

How a stage joins the tour: its setup.py declares an entry point in the group ``eml.tour``,

    entry_points={"eml.tour": ["01_python_layer = eml.ext.linear_python:TOUR"]}

naming a dict in the stage's package with any of these keys:

    "layers": {label: factory}   factory(in_features, out_features, bias=True) -> Module;
                                 each label gets a correctness line and timing rows
    "demo":   callable           run and reported (e.g. stage 03's hello())
    "peak_gflops": callable      returns the machine's practical FP32 GFLOP/s; the table
                                 then shows every GFLOP/s figure also as a % of it
    "checks": {label: callable}  callable() -> (ok, line): any other correctness line

The keys the further sections read are listed in their own modules: "cells" and "floors"
(lltm_bench, the latter with --floor), "bf16_layers", "peak_gflops_bf16", "bf16_path"
(tour_bf16), "compile_layers" (tour_compile).

Further sections (another example's benchmark, another dtype's table) live in their own
module of eml.common, named in EXTRA_SECTIONS; each has ``tour_section(stages, quick) -> ok``,
prints its own lines after the float32 table, and returns False on a correctness failure.

The tour never names a stage: installing a stage is what adds it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import math
import os
import re
import subprocess
import sys
import time

import torch

from eml.common import checks, numpy_linear, timing
from eml.common.timing import cpu_name  # kept here too: notebooks and scripts call tour.cpu_name()

BASELINE = "torch.nn.Linear"

# Modules of eml.common with a tour_section(stages, quick) -> bool, run in this order.
EXTRA_SECTIONS = [
    "eml.common.tour_bf16",
    "eml.common.lltm_bench",  # the LLTM stages (09-11, 17; 12 has its own GPU benchmark): correctness, and pytorch/extension-cpp's benchmark
    "eml.common.tour_compile",  # registered operators (08, 16): dispatch overhead, compiled MLP vs nn.Linear
]


def discover_stages():
    """(name, registration dict) for every installed stage, in stage order."""
    points = importlib.metadata.entry_points(group="eml.tour")
    return [(point.name, point.load()) for point in sorted(points, key=lambda p: p.name)]


def mkl_code_path(verbose_output):
    """The code path MKL names in its MKL_VERBOSE banner, or None when the text holds no banner.

    The banner is the first MKL_VERBOSE line; it names the path between "for" and the OS field
    ("Lnx", "Win" or "OSX", then the clock), on any CPU:
      AMD CPUs:    "... for Intel(R) 64 architecture Intel(R) Architecture processors, Lnx ..."
                   (MKL's generic path)
      AVX2 Intel:  "... for Intel(R) 64 architecture Intel(R) Advanced Vector Extensions 2
                   (Intel(R) AVX2) enabled processors, Lnx ..."
      Intel Xeon:  "... for Intel(R) 64 architecture Intel(R) Advanced Vector Extensions 512
                   (Intel(R) AVX-512) with support of Intel(R) Deep Learning Boost ..., Lnx ..."
    The name is cut at the OS field, not at its first comma: the longer names hold commas."""
    for line in verbose_output.splitlines():
        match = re.match(r"MKL_VERBOSE .*? for (.+?),? (?:Lnx|Win|OSX) ", line)
        if match:
            return match.group(1).strip()
    return None


def mkl_path():
    """Which code path torch's float32 GEMM takes: MKL prints it under MKL_VERBOSE=1 (README).

    Run in a child process: MKL reads MKL_VERBOSE once, when it loads."""
    code = "import torch; torch.mm(torch.ones(64, 64), torch.ones(64, 64))"
    try:
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MKL_VERBOSE": "1"},
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "code path unknown"
    return mkl_code_path(out) or "no MKL_VERBOSE banner: another BLAS?"


def check_layer(make_layer, shape):
    """One line of correctness: max errors in float32 on a benchmark shape, gradcheck in float64."""
    n, in_features, out_features = shape
    torch.manual_seed(0)
    layer = make_layer(in_features, out_features)
    errors = checks.max_errors(layer, torch.randn(n, in_features))
    small = make_layer(7, 5).to(torch.float64)
    input = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)

    def run(input, weight, bias):
        return torch.func.functional_call(small, {"weight": weight, "bias": bias}, (input,))

    try:
        verdict = "pass" if checks.gradcheck(run, input, small.weight, small.bias) else "FAIL"
    except Exception as error:  # gradcheck raises with the mismatching Jacobian
        verdict = f"FAIL ({str(error).splitlines()[0]})"
    worst = max(errors.values())
    ok = verdict == "pass" and worst < 1e-3 and not math.isnan(worst)
    text = "  ".join(f"{name.replace('grad_', 'd')} {value:.1e}" for name, value in errors.items())
    return ok, f"max|err| float32 {'x'.join(map(str, shape))}: {text}; float64 gradcheck: {verdict}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="first shape only, short timings")
    parser.add_argument("--rounds", type=int, default=timing.TOUR_SETTINGS["rounds"], help="interleaved timing rounds per shape")
    parser.add_argument("--min-run-time", type=float, default=timing.TOUR_SETTINGS["min_run_time"], help="least seconds per layer and round")
    args = parser.parse_args(argv)
    shapes = timing.BENCHMARK_SHAPES[:1] if args.quick else timing.BENCHMARK_SHAPES
    rounds, min_run_time = (1, 0.02) if args.quick else (args.rounds, args.min_run_time)

    print(f"From PyTorch to Machine Code: the tour (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, CPU: {cpu_name()})", flush=True)
    stages = discover_stages()
    if not stages:
        print("no stage is installed: run `make` (or pip install --no-build-isolation ./NN_stage)")
        return 1

    # Two baselines: torch.nn.Linear (MKL in torch's x86 wheels) and the same layer on numpy's OpenBLAS.
    makers = {BASELINE: lambda i, o: torch.nn.Linear(i, o), numpy_linear.LABEL: numpy_linear.NumpyLinear}
    failures, peaks = [], []
    for index, (name, stage) in enumerate(stages, 1):
        print(f"[{index}/{len(stages)}] {name}", flush=True)
        if "demo" in stage:
            try:
                result = stage["demo"]()
                sys.stdout.flush()
                print(f"  demo: ok{'' if result is None else f' ({result})'}", flush=True)
            except Exception as error:
                failures.append(name)
                print(f"  demo: FAIL {error!r}", flush=True)
        for label, make_layer in stage.get("layers", {}).items():
            ok, line = check_layer(make_layer, shapes[0])
            print(f"  {label}: {line}", flush=True)
            if not ok:
                failures.append(label)
            makers[label] = make_layer
        for label, check in stage.get("checks", {}).items():
            try:
                ok, line = check()
            except Exception as error:
                ok, line = False, f"FAIL {error!r}"
            print(f"  {label}: {line}", flush=True)
            if not ok:
                failures.append(label)
        if "peak_gflops" in stage:
            peaks.append(stage["peak_gflops"]())
            print(f"  peak probe: {peaks[-1]:.1f} GFLOP/s (in-cache kernel loop, float32, all threads)", flush=True)

    print(f"\ntiming: float32, {torch.get_num_threads()} threads, median of {rounds} interleaved rounds;"
          f" x = speed-up over {BASELINE}", flush=True)
    print(f"  {BASELINE} runs MKL's SGEMM ({mkl_path()}); {numpy_linear.LABEL} runs {numpy_linear.blas_name()}", flush=True)
    results = []
    for shape in shapes:
        start = time.perf_counter()
        print(f"  timing {'x'.join(map(str, shape))} ...", end="", flush=True)
        results += timing.time_layers(makers, shape, rounds=rounds, min_run_time=min_run_time)
        print(f" {time.perf_counter() - start:.0f} s", flush=True)
    print()
    # Every probe measures the same thing; one that overlapped other work reads low, never high.
    peak = max(peaks, default=None)
    if peak:
        print(f"%pk: share of {peak:.1f} GFLOP/s, the best of the {len(peaks)} peak probes above")
    print(timing.format_table(results, BASELINE, peak_gflops=peak))
    for section in EXTRA_SECTIONS:
        print(flush=True)
        if not importlib.import_module(section).tour_section(stages, args.quick):
            failures.append(section)
    if failures:
        print(f"\ncorrectness FAILED for: {', '.join(failures)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
