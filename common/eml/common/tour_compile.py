"""Tour section: layers that are registered operators, under torch.compile, and what a call costs.

    python -m eml.common.tour            # this section runs after the float32 table
    python -m eml.common.tour --quick    # no torch.compile: the dispatch table on one tiny shape

Two tables:
1. Dispatch overhead: every installed stage's layer, eager, on a shape so small (1 x 16 x 16)
   that the arithmetic is nothing and the microseconds are the cost of getting from Python to
   the kernel and back (pybind11 and an autograd.Function, or the dispatcher and a registered
   op), next to the tour's smallest benchmark shape.
2. A compiled MLP: an MLP built from each stage's "compile_layers" (TOUR key: layers whose
   forward torch.compile can trace whole), compiled by inductor, against the same MLP on
   torch.nn.Linear compiled by inductor; forward (no_grad) and a training step (forward and
   the parameters' gradients; the input needs none), float32 and bfloat16 parameters. Before timing, the compiled MLP's output and
   gradients are checked against the compiled nn.Linear MLP's.
Medians of interleaved rounds, on all threads (torch.get_num_threads()).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from eml.common import op_checks, timing

BASELINE = "torch.nn.Linear"
DISPATCH_SHAPES = [(1, 16, 16), timing.BENCHMARK_SHAPES[0]]
# The compiled MLP: a transformer's MLP block, 768 -> 3072 -> GELU -> 768, on 512 tokens.
MLP_BATCH, MLP_SIZES, MLP_ACTIVATIONS = 512, (768, 3072, 768), (torch.nn.GELU,)
DTYPES = [torch.float32, torch.bfloat16]


def _median_us(calls, rounds, min_run_time):
    """Median microseconds of each call, over interleaved rounds, on all threads."""
    times = timing.interleaved(calls, rounds, min_run_time, torch.get_num_threads())
    return {label: 1e6 * statistics.median(values) for label, values in times.items()}


def _dispatch_table(layers, quick):
    shapes = DISPATCH_SHAPES[:1] if quick else DISPATCH_SHAPES
    rounds, min_run_time = (1, 0.02) if quick else (3, 0.1)
    print(f"dispatch overhead: eager layers, float32, median us per call ({rounds} interleaved round(s))", flush=True)
    print(f"  {'layer':24s} {'N x in x out':>14s} {'fwd us':>9s} {'fwd+bwd us':>11s}")
    makers = {BASELINE: lambda i, o: torch.nn.Linear(i, o), **layers}
    for shape in shapes:
        for result in timing.time_layers(makers, shape, rounds=rounds, min_run_time=min_run_time):
            print(f"  {result.label:24s} {'x'.join(map(str, shape)):>14s} {result.forward_us:9.1f} {result.training_us:11.1f}")
    print(flush=True)


def _training_call(model, x):
    params = list(model.parameters())
    return lambda: torch.autograd.grad(model(x).sum(), params)


def _outputs_and_grads(model, x):
    """Output and every parameter's gradient (x as the timing uses it: no gradient, so a compiled
    model is not compiled again for an input that requires one)."""
    y = model(x)
    grads = torch.autograd.grad(y.float().pow(2).sum() / y.numel(), list(model.parameters()))
    return [y.detach(), *grads]


def _relative_error(got, want):
    scale = want.float().abs().max().item()
    return (got.float() - want.float()).abs().max().item() / (scale if scale > 0 else 1.0)


def _check(label, layers_model, reference, x, dtype):
    """Max error relative to each tensor's size, compiled MLP against the compiled nn.Linear MLP's
    output and gradients (``reference``, from _outputs_and_grads: computed once for every stage)."""
    names = ["out"] + [f"d{i}" for i in range(len(list(layers_model.parameters())))]
    errors = [_relative_error(g, w) for g, w in zip(_outputs_and_grads(layers_model, x), reference)]
    limit = 1e-4 if dtype == torch.float32 else 5e-2
    worst = max(errors)
    ok = worst < limit and not math.isnan(worst)
    print(f"  {label} {str(dtype).removeprefix('torch.')}: max relative error of output and {len(names) - 1} "
          f"gradients {worst:.1e} (limit {limit:.0e}): {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def _compiled_tables(layers):
    ok = True
    layer_flops = [2 * MLP_BATCH * i * o for i, o in zip(MLP_SIZES[:-1], MLP_SIZES[1:])]
    flops = sum(layer_flops)
    # The timed step asks for the parameters' gradients only: x needs none, so every layer
    # computes grad_weight but the first skips grad_input. Five GEMMs of the six, not three times the forward.
    train_flops = flops + flops + (flops - layer_flops[0])
    rows = []
    for dtype in DTYPES:
        x = torch.randn(MLP_BATCH, MLP_SIZES[0], generator=torch.Generator().manual_seed(0)).to(dtype)
        makers = {BASELINE: torch.nn.Linear, **layers}
        calls, start = {}, time.perf_counter()
        compiled = {}
        # Every compiled module enters dynamo through one shared wrapper frame, whose recompile
        # limit (8 by default) counts the graphs of all of them: three MLPs x two grad modes x two
        # dtypes exceed it, and dynamo would then silently run the last MLPs eagerly. A fresh start
        # per dtype, and room for every model's two graphs.
        torch._dynamo.reset()
        torch._dynamo.config.recompile_limit = max(8, 2 * len(makers) + 2)
        for label, make in makers.items():
            model = op_checks.mlp(make, MLP_SIZES, dtype=dtype, activations=MLP_ACTIVATIONS)
            compiled[label] = torch.compile(model, dynamic=False)  # inductor
            calls[label] = (timing.inference_call(compiled[label], x), _training_call(compiled[label], x))
            calls[label][0]()  # compile the inference graph now, not inside the timing
            calls[label][1]()  # and the training graphs
        print(f"  compiled {len(makers)} MLPs in {str(dtype).removeprefix('torch.')} in {time.perf_counter() - start:.0f} s", flush=True)
        reference = _outputs_and_grads(compiled[BASELINE], x)
        for label in layers:
            ok &= _check(label, compiled[label], reference, x, dtype)
        forward = _median_us({label: pair[0] for label, pair in calls.items()}, rounds=3, min_run_time=0.2)
        training = _median_us({label: pair[1] for label, pair in calls.items()}, rounds=3, min_run_time=0.2)
        for label in makers:
            rows.append((label, dtype, forward[label], training[label],
                         forward[BASELINE] / forward[label], training[BASELINE] / training[label]))
    shape = f"{MLP_BATCH}x" + "-".join(map(str, MLP_SIZES))
    print(f"\n  compiled MLP {shape} (GELU between layers), inductor; x = speed-up over the same MLP on {BASELINE}")
    print(f"  {'layers':24s} {'dtype':>9s} {'fwd us':>9s} {'train us':>10s} {'fwd GF/s':>9s} {'train GF/s':>10s} {'fwd x':>6s} {'train x':>7s}")
    for label, dtype, fwd, train, fwd_x, train_x in rows:
        print(f"  {label:24s} {str(dtype).removeprefix('torch.'):>9s} {fwd:9.0f} {train:10.0f} {flops / fwd / 1e3:9.1f} "
              f"{train_flops / train / 1e3:10.1f} {fwd_x:6.2f} {train_x:7.2f}")
    return ok


def tour_section(stages, quick):
    """stages: [(name, TOUR dict)] of every installed stage; prints this section; False on a
    correctness failure."""
    layers = {label: make for _, stage in stages for label, make in stage.get("layers", {}).items()}
    compile_layers = {label: make for _, stage in stages for label, make in stage.get("compile_layers", {}).items()}
    print("registered operators: dispatch overhead and torch.compile", flush=True)
    _dispatch_table(layers, quick)
    if not compile_layers:
        print("  no installed stage declares compile_layers: no compiled-MLP table")
        return True
    if quick:
        # No torch.compile in quick mode (tens of seconds per model): the eager MLP, checked.
        ok = True
        x = torch.randn(5, 16)
        reference = _outputs_and_grads(op_checks.mlp(torch.nn.Linear), x)
        for label, make in compile_layers.items():
            ok &= _check(label, op_checks.mlp(make), reference, x, torch.float32)
        print("  (quick: compiled-MLP timing skipped)")
        return ok
    return _compiled_tables(compile_layers)
