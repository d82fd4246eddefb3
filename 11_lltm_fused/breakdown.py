"""Where stage 11's time goes, per call, in microseconds: the C++ passes, their GEMMs, and what
the module adds around them, for the C++ autograd node (_C.cell, what LLTM.forward calls) and
for the Python LLTMFunction it replaced. Where stage 06 is installed, the same two GEMMs on its
LIBXSMM kernels too (README, exercise 1: what they would buy).

    python 11_lltm_fused/breakdown.py            # both benchmark shapes, all threads
    python 11_lltm_fused/breakdown.py --threads 1

Medians of torch.utils.benchmark blocks (num_threads set), float32, inputs without
requires_grad as in the LLTM benchmark. The rows do not add up exactly: each is timed alone.
"""

import argparse

import torch
import torch.utils.benchmark as benchmark

from eml.common.lltm_bench import SHAPES
from eml.common.timing import cpu_name
from eml.lltm_fused import LLTM, LLTMFunction, _C

try:
    from eml.linear_tpp import _C as stage06  # the linear layer's LIBXSMM products, for exercise 1
except ImportError:
    stage06 = None


def median_us(statement, env, threads, min_run_time=0.3):
    timer = benchmark.Timer(statement, globals=env, num_threads=threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e6


def breakdown(shape, threads):
    batch, features, state = shape
    torch.manual_seed(0)
    cell = LLTM(features, state)
    weights, bias = cell.weights.detach(), cell.bias.detach()
    x, h, c = torch.randn(batch, features), torch.randn(batch, state), torch.randn(batch, state)
    new_h, new_cell, gates = _C.forward(x, weights, bias, h, c)
    grad_h, grad_cell = torch.randn(batch, state), torch.randn(batch, state)
    X = torch.cat([h, x], 1)
    env = dict(_C=_C, torch=torch, cell=cell, LLTMFunction=LLTMFunction, x=x, h=h, c=c, w=weights, b=bias,
               gates=gates, new_cell=new_cell, gh=grad_h, gc=grad_cell, X=X)
    step = "cell.zero_grad(set_to_none=True); torch.autograd.backward({}, (gh, gc))"
    rows = {
        "C++ forward (_C.forward)": "_C.forward(x, w, b, h, c)",
        "  of which the GEMM (addmm)": "torch.addmm(b, X, w.t())",
        "  that GEMM on stage 06's kernels": "stage06.forward(X, w, b, state06, False)",
        "C++ backward (_C.backward)": "_C.backward(gh, gc, new_cell, gates, x, h, w, False, True)",
        "  of which the GEMM (d_weights)": "gates.t().mm(X)",
        "  that GEMM + d_bias on stage 06's kernels": "stage06.backward(gates, X, None, False, True, True, state06)",
        "module forward + backward, _C.cell": step.format("cell(x, (h, c))"),
        "the same through Python's LLTMFunction": step.format("LLTMFunction.apply(x, cell.weights, cell.bias, h, c)"),
    }
    if stage06 is None:
        rows = {label: statement for label, statement in rows.items() if "stage06" not in statement}
    else:  # a kept state (kernels, plans); the weight packed per call, as in training
        env.update(stage06=stage06, state06=stage06.LinearState(state + features, 3 * state))
    return {label: median_us(statement, env, threads) for label, statement in rows.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    print(f"stage 11, where the time goes: float32, {args.threads} threads, median us per call; CPU: {cpu_name()}")
    for shape in SHAPES:
        times = breakdown(shape, args.threads)
        print(f"  batch {shape[0]}, features {shape[1]}, state {shape[2]}:")
        for label, us in times.items():
            print(f"    {label:42s} {us:8.1f}")
        passes = times["C++ forward (_C.forward)"] + times["C++ backward (_C.backward)"]
        for label, short in (("module forward + backward, _C.cell", "_C.cell"),
                             ("the same through Python's LLTMFunction", "LLTMFunction")):
            print(f"    {'beyond the two C++ passes, ' + short:42s} {times[label] - passes:8.1f}")


if __name__ == "__main__":
    main()
