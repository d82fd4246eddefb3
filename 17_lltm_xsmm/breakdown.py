"""Where stage 17's time goes, per call, in microseconds: the C++ passes, their fused element-wise
part, the same passes with one kernel per thread (no blocks, section 3c of lltm.cpp), stage 11's
passes (ATen's GEMMs) beside them where stage 11 is installed, and what the module adds around
the passes, for the C++ autograd node (_C.cell, what LLTM.forward calls) and for the Python
LLTMFunction. For the C++ node the step is then told in four parts that add up to it: the step
of a module whose C++ node computes nothing (floor_cell, the LLTM benchmark's C++ floor), the two
passes called on their own, what they cost more right after such a step (a row that times the
floor's step and the passes in one statement), and the rest, what 17's node does beyond a node
that computes nothing (checks, the tensors it allocates and saves).

    python 17_lltm_xsmm/breakdown.py                      # both benchmark shapes, all threads
    python 17_lltm_xsmm/breakdown.py --threads 1
    python 17_lltm_xsmm/breakdown.py --block-sizes 32,128 # other blocks (depth, rows; 0: none)
    python 17_lltm_xsmm/breakdown.py --against /tmp/_C_before.so   # beside another build (below)
    python 17_lltm_xsmm/breakdown.py --rounds 15          # more interleaved rounds (default 3)

--against times another build of the module beside this one, in the same process: copy the
installed module's file before a change (python -c "import eml.lltm_xsmm._C as m; print(m.__file__)"
names it), rebuild with the change, then pass the copy. Its rows are marked "(before)", each after
the row it compares with; the step is compared with both nodes called directly ("_C.cell alone":
_C.cell and the copy's cell, no module around either), like for like.

Medians of torch.utils.benchmark blocks (num_threads set) over 3 interleaved rounds (--rounds; new in 17:
single runs of stage 11's version moved by 30 % between runs on a 2-core Zen 5 virtual machine), float32, inputs
without requires_grad as in the LLTM benchmark. The timed rows do not add up exactly: each is
timed alone; the four parts printed last do, by construction.
"""

import argparse
import importlib.util
import itertools
import os
import statistics

import torch
import torch.utils.benchmark as benchmark

from eml.common.lltm_bench import SHAPES
from eml.common.timing import cpu_name
from eml.lltm_xsmm import LLTM, LLTMFunction, _C, floor_cell

try:
    from eml.lltm_fused import _C as stage11  # the same passes with ATen's GEMMs, timed beside
except ImportError:
    stage11 = None


def median_us(statements, env, threads, rounds=3, min_run_time=0.1):
    """{label: median us} of every statement, the rounds interleaved."""
    timers = {label: benchmark.Timer(statement, globals=env, num_threads=threads) for label, statement in statements.items()}
    times = {label: [] for label in statements}
    for _ in range(rounds):
        for label, timer in timers.items():
            times[label] += timer.blocked_autorange(min_run_time=min_run_time).times
    return {label: statistics.median(values) * 1e6 for label, values in times.items()}


def unblocked(function, *arguments):
    """function(*arguments) with one kernel per thread (block sizes 0), the blocks restored after."""
    blocks = _C.block_sizes()
    _C.set_block_sizes(0, 0)
    try:
        return function(*arguments)
    finally:
        _C.set_block_sizes(*blocks)


_loads = itertools.count()  # numbers the other builds loaded, for their module names


def load_other_build(path):
    """Another build of this stage's module (a copy of its .so file), imported beside
    eml.lltm_xsmm._C. Its name ends in _C, as its initialisation function (PyInit__C) requires,
    and is new on every call: Python keeps a compiled module it loaded by its name, and would hand
    back the first file loaded under a name for any later one. Refused by name: a missing file, one
    that is no extension module, and a module that is not this stage's (stage 11's _C, say)."""
    if not os.path.isfile(path):
        raise SystemExit(f"breakdown.py: --against {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"other_build_{next(_loads)}._C", path)
    if spec is None:
        raise SystemExit(f"breakdown.py: --against {path}: not a Python extension module's file (a .so)")
    try:
        module = importlib.util.module_from_spec(spec)  # dlopen and PyInit__C
        spec.loader.exec_module(module)
    except ImportError as error:
        raise SystemExit(f"breakdown.py: --against {path}: not a Python extension module's file (a .so): {error}")
    if not all(hasattr(module, name) for name in ("forward", "backward", "cell", "block_sizes")):
        raise SystemExit(f"breakdown.py: --against {path}: not a build of stage 17's module (no block_sizes)")
    return module


def rows_and_env(shape, before=None):
    """({label: statement}, globals) for one shape: what breakdown() times, in print order. With
    another build (before), each of its rows follows the row it compares with."""
    batch, features, state = shape
    torch.manual_seed(0)
    cell = LLTM(features, state)
    weights, bias = cell.weights.detach(), cell.bias.detach()
    x, h, c = torch.randn(batch, features), torch.randn(batch, state), torch.randn(batch, state)
    new_h, new_cell, gates = _C.forward(x, weights, bias, h, c)
    grad_h, grad_cell = torch.randn(batch, state), torch.randn(batch, state)
    X = torch.cat([h, x], 1)
    env = dict(_C=_C, unblocked=unblocked, stage11=stage11, torch=torch, cell=cell, LLTMFunction=LLTMFunction, x=x, h=h, c=c, w=weights,
               b=bias, gates=gates, new_cell=new_cell, gh=grad_h, gc=grad_cell, X=X, before=before,
               floor=floor_cell(features, state))
    step = "cell.zero_grad(set_to_none=True); torch.autograd.backward({}, (gh, gc))"
    floor_step = "floor.zero_grad(set_to_none=True); torch.autograd.backward(floor(x, (h, c)), (gh, gc))"
    forward, backward = "_C.forward(x, w, b, h, c)", "_C.backward(gh, gc, new_cell, gates, x, h, w, False, True)"
    # (label, statement, what the row needs: stage 11's module, another build (--against), or
    # nothing; stage 11's GEMMs "alone" are ATen calls, timed with or without stage 11)
    rows = [
        ("C++ forward (_C.forward)", forward, None),
        ("C++ forward (before)", "before.forward(x, w, b, h, c)", "before"),
        ("  of which the fused pass (_C.forward_pass)", "_C.forward_pass(gates, c)", None),
        ("  the forward, one kernel per thread (no blocks)", "unblocked(_C.forward, x, w, b, h, c)", None),
        ("  stage 11's forward (ATen's GEMM)", "stage11.forward(x, w, b, h, c)", "stage11"),
        ("  stage 11's GEMM alone (cat + addmm)", "torch.addmm(b, torch.cat([h, x], 1), w.t())", None),
        ("C++ backward (_C.backward)", backward, None),
        ("C++ backward (before)", "before.backward(gh, gc, new_cell, gates, x, h, w, False, True)", "before"),
        ("  the backward, one kernel per thread (no blocks)",
         "unblocked(_C.backward, gh, gc, new_cell, gates, x, h, w, False, True)", None),
        ("  stage 11's backward (ATen's GEMMs)", "stage11.backward(gh, gc, new_cell, gates, x, h, w, False, True)", "stage11"),
        ("  stage 11's d_weights alone (cat + mm)", "gates.t().mm(torch.cat([h, x], 1))", None),
        ("module forward + backward, _C.cell", step.format("cell(x, (h, c))"), None),
        ("the same through Python's LLTMFunction", step.format("LLTMFunction.apply(x, cell.weights, cell.bias, h, c)"), None),
        # the same step for a module whose C++ node computes nothing: what the step costs around any
        # C++ node's work (the LLTM benchmark's --floor row of the same name)
        ("the C++ floor (floor_cell: computes nothing)", floor_step, None),
        # ... and that step followed by the two passes above, timed as one statement: the module's
        # step less this row is what 17's node adds beyond the floor and its passes
        ("floor_cell's step, then the two C++ passes", f"{floor_step}; {forward}; {backward}", None),
        # like for like with the other build: both nodes called without the module around them
        ("forward + backward, _C.cell alone", step.format("_C.cell(x, cell.weights, cell.bias, h, c)"), "before"),
        ("forward + backward, _C.cell alone (before)", step.format("before.cell(x, cell.weights, cell.bias, h, c)"), "before"),
    ]
    available = {None: True, "stage11": stage11 is not None, "before": before is not None}
    return {label: statement for label, statement, needs in rows if available[needs]}, env


def breakdown(shape, threads, before=None, rounds=3):
    """{label: median us} for one shape, every row timed (interleaved rounds)."""
    rows, env = rows_and_env(shape, before)
    return median_us(rows, env, threads, rounds=rounds)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--block-sizes", type=lambda text: tuple(int(v) for v in text.split(",")), default=None,
                        metavar="DEPTH,ROWS", help="the GEMMs' block sizes (default: the module's, %s; 0: no blocks)"
                        % ",".join(map(str, _C.block_sizes())))
    parser.add_argument("--against", metavar="SO_FILE", default=None,
                        help="another build of the module (a copy of its .so) to time beside this one")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of every row (default 3; more where a machine's timings drift)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    before = load_other_build(args.against) if args.against else None
    if args.block_sizes is not None:
        _C.set_block_sizes(*args.block_sizes)
        if before is not None:
            before.set_block_sizes(*args.block_sizes)
    depth, rows = _C.block_sizes()
    print(f"stage 17, where the time goes: float32, {args.threads} threads, median us per call, blocks {depth} deep "
          f"and {rows} rows, {args.rounds} rounds; CPU: {cpu_name()}")
    for shape in SHAPES:
        times = breakdown(shape, args.threads, before, args.rounds)
        print(f"  batch {shape[0]}, features {shape[1]}, state {shape[2]}:")
        for label, us in times.items():
            print(f"    {label:50s} {us:8.1f}")
        passes = times["C++ forward (_C.forward)"] + times["C++ backward (_C.backward)"]
        for label, short in (("module forward + backward, _C.cell", "_C.cell"),
                             ("the same through Python's LLTMFunction", "LLTMFunction")):
            print(f"    {'beyond the two C++ passes, ' + short:50s} {times[label] - passes:8.1f}")
        # The module's step in four parts that add up to it by construction: the C++ floor's step,
        # the two passes called on their own, what they cost more right after a floor step than
        # back to back, and what is left: what 17's node does beyond a node that computes nothing
        # (checks, the tensors it allocates and saves, d_bias's reshape). The last two are
        # differences of medians and share a row: noise moves between them, and either can come
        # out negative.
        floor, floor_and_passes = (times["the C++ floor (floor_cell: computes nothing)"],
                                   times["floor_cell's step, then the two C++ passes"])
        parts = [("  the C++ floor's step", floor),
                 ("  + the two C++ passes, called alone", passes),
                 ("  + their extra cost right after a floor step", floor_and_passes - floor - passes),
                 ("  + the rest (the node beyond the floor; noise)",
                  times["module forward + backward, _C.cell"] - floor_and_passes)]
        print("    the step of _C.cell's module, in four parts:")
        for label, us in parts:
            print(f"    {label:50s} {us:8.1f}")


if __name__ == "__main__":
    main()
