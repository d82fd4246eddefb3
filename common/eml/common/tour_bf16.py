"""The tour's bfloat16 section: every stage's bf16 layers against torch.nn.Linear in bf16 and in float32.

A stage joins it with these keys of its TOUR dict (common/eml/common/tour.py names this module
in EXTRA_SECTIONS):

    "bf16_layers": {label: factory}   factory(in, out, bias=True) -> Module that computes in bf16
    "peak_gflops_bf16": callable      the bf16 peak probe in GFLOP/s, or None without bf16 kernels
    "bf16_path": callable             which path a new layer takes on this CPU ("vnni", "fp32", ...)

Printed: one correctness line per bf16 layer (max error against float64 beside torch's own bf16
error, the rule of eml.common.bf16_checks, and autocast like nn.Linear), the bf16 peak probe or
the reason there is none, then one timing table: N x in x out, forward and forward+backward,
GFLOP/s, % of the peak (the bf16 one, else the float32 one, and the header says which), and the
speed-up of forward+backward over torch.nn.Linear in bf16 (x bf16) and in float32 (x fp32).
"""

from __future__ import annotations

import statistics
import time

import torch

from eml.common import bf16_checks, timing
from eml.common.checks import Case

TORCH_BF16 = "torch.nn.Linear bf16"
TORCH_FP32 = "torch.nn.Linear fp32"


def _correctness(label, make_layer, shape):
    n, in_features, out_features = shape
    errors = bf16_checks.bf16_errors(make_layer, Case((n,), in_features, out_features))
    ok = all(s <= bf16_checks.FACTOR * t + bf16_checks.FLOOR * scale for s, t, scale in errors.values())
    text = "  ".join(f"{name.replace('grad_', 'd')} {s:.1e} ({t:.1e})" for name, (s, t, _) in errors.items())
    try:
        bf16_checks.check_autocast_like_nn_linear(make_layer)
        autocast = "autocast like nn.Linear: ok"
    except AssertionError as error:
        ok, autocast = False, f"autocast: FAIL ({str(error).splitlines()[0]})"
    verdict = "ok" if ok else "FAIL"
    return ok, (f"  {label}: max|err| bf16 vs float64 {'x'.join(map(str, shape))} (torch.nn.Linear bf16's in brackets): "
                f"{text}; {verdict}; {autocast}")


def tour_section(stages, quick: bool) -> bool:
    makers = {label: make for _, stage in stages for label, make in stage.get("bf16_layers", {}).items()}
    if not makers:
        return True
    shapes = timing.BENCHMARK_SHAPES[:1] if quick else timing.BENCHMARK_SHAPES
    rounds, min_run_time = (1, 0.02) if quick else (3, 0.2)
    print("bfloat16: stages' bf16 layers against torch.nn.Linear in bf16 and in float32", flush=True)
    ok = True
    peak, peak_kind = None, "bf16"
    paths = {}  # bf16 layer label -> its path on this CPU ("vnni": native bf16 kernels)
    for name, stage in stages:
        if "bf16_layers" not in stage:
            continue
        path = stage["bf16_path"]() if "bf16_path" in stage else "unknown"
        print(f"  {name}: bf16 path on this CPU: {path}", flush=True)
        paths.update({label: path for label in stage["bf16_layers"]})
        for label, make in stage["bf16_layers"].items():
            line_ok, line = _correctness(label, make, shapes[0])
            ok &= line_ok
            print(line, flush=True)
        if "peak_gflops_bf16" in stage:
            peak = stage["peak_gflops_bf16"]()
            if peak is None:
                print("  bf16 peak probe: no bf16 kernels on this CPU: float32 path", flush=True)
            else:
                print(f"  bf16 peak probe: {peak:.1f} GFLOP/s (in-cache bf16 kernel loop, all threads)", flush=True)
    if peak is None:  # no bf16 peak: show the share of the float32 one, and say so
        fp32_peaks = [stage["peak_gflops"] for _, stage in stages if "peak_gflops" in stage]
        if fp32_peaks:
            peak, peak_kind = max(probe() for probe in fp32_peaks), "fp32"
            print(f"  float32 peak probe, for %pk fp32: {peak:.1f} GFLOP/s (best of the {len(fp32_peaks)} stages' probes)",
                  flush=True)

    print(f"\ntiming: {torch.get_num_threads()} threads, median of {rounds} interleaved rounds; "
          f"x bf16 / x fp32 = forward+backward speed-up over {TORCH_BF16} / {TORCH_FP32}", flush=True)
    results = []
    for shape in shapes:
        start = time.perf_counter()
        print(f"  timing {'x'.join(map(str, shape))} ...", end="", flush=True)
        bf16 = timing.time_layers({TORCH_BF16: lambda i, o: torch.nn.Linear(i, o), **makers}, shape,
                                  dtype=torch.bfloat16, rounds=rounds, min_run_time=min_run_time)
        fp32 = timing.time_layers({TORCH_FP32: lambda i, o: torch.nn.Linear(i, o)}, shape,
                                  dtype=torch.float32, rounds=rounds, min_run_time=min_run_time)
        results += fp32 + bf16
        print(f" {time.perf_counter() - start:.0f} s", flush=True)
    print()
    print(format_table(results, peak, peak_kind))
    for label in makers:
        print(summary(results, label, native=paths.get(label) == "vnni"), flush=True)
    return ok


def format_table(results, peak=None, peak_kind="bf16"):
    pk = f"%pk {peak_kind}"
    header = (f"{'layer':<22} {'N x in x out':>16} {'fwd us':>10} {'fwd+bwd us':>11} {'fwd GF/s':>9} {'f+b GF/s':>9}"
              + (f" {'fwd ' + pk:>12} {'f+b ' + pk:>12}" if peak else "") + f" {'x bf16':>7} {'x fp32':>7}")
    lines = [header, "-" * len(header)]
    by_shape = {}
    for t in results:
        by_shape.setdefault(t.shape, {})[t.label] = t
    for shape, rows in by_shape.items():
        if len(lines) > 2:
            lines.append("")
        for t in rows.values():
            row = (f"{t.label:<22} {'x'.join(map(str, shape)):>16} {t.forward_us:>10.1f} {t.training_us:>11.1f}"
                   f" {t.forward_gflops:>9.1f} {t.training_gflops:>9.1f}")
            if peak:
                row += f" {100 * t.forward_gflops / peak:>11.0f}% {100 * t.training_gflops / peak:>11.0f}%"
            row += f" {rows[TORCH_BF16].training_us / t.training_us:>7.2f} {rows[TORCH_FP32].training_us / t.training_us:>7.2f}"
            lines.append(row)
    return "\n".join(lines)


def summary(results, label, native=False):
    """One line: median and worst forward+backward speed-up of one layer, and whether it meets the
    bf16 goals: at least 1.1x torch.nn.Linear in bf16 (none below 1.0x), and against it in float32
    at least 1.5x where the layer runs native bf16 kernels (``native``), else at least 0.75x (the
    float32 kernels plus the conversions: a bf16 layer on a CPU without bf16 hardware)."""
    by_shape = {}
    for t in results:
        by_shape.setdefault(t.shape, {})[t.label] = t
    over_bf16 = [rows[TORCH_BF16].training_us / rows[label].training_us for rows in by_shape.values()]
    over_fp32 = [rows[TORCH_FP32].training_us / rows[label].training_us for rows in by_shape.values()]
    bf16_median, fp32_median = statistics.median(over_bf16), statistics.median(over_fp32)
    fp32_goal = 1.5 if native else 0.75
    met = bf16_median >= 1.1 and min(over_bf16) >= 1.0 and fp32_median >= fp32_goal
    return (f"  {label}: forward+backward over {TORCH_BF16}: median {bf16_median:.2f}x (worst {min(over_bf16):.2f}x); "
            f"over {TORCH_FP32}: median {fp32_median:.2f}x; goals (>= 1.1x bf16, none < 1.0x, >= {fp32_goal}x fp32 "
            f"{'with' if native else 'without'} native bf16 kernels): {'met' if met else 'missed'}")
