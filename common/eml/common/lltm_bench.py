"""The LLTM benchmark, for every installed LLTM stage, and the tour's LLTM section. It follows
benchmark.py of pytorch/extension-cpp, the code of PyTorch's tutorial "Custom C++ and CUDA
Extensions" (the tutorial's text times a similar loop: on the CPU it prints the total seconds of
its calls, on the GPU the average per call in us).

    python -m eml.common.lltm_bench              # both shapes, every installed LLTM stage
    python -m eml.common.lltm_bench --threads 1  # torch.set_num_threads(1) first
    python -m eml.common.lltm_bench --quick      # the tutorial's shape, a few runs
    python -m eml.common.lltm_bench --floor      # and last rows: cells that compute nothing
    python -m eml.common.lltm_bench --shape 1,1,1  # one (batch, features, state) of your own

Per cell and shape it prints benchmark.py's line (``Forward: {min}/{avg} us | Backward {min}/{avg} us``;
here with a colon after Backward and one decimal),
then the speed-up of forward + backward over stage 09's nn.Module (the first cell found, plain
autograd), from the minima and from the averages, and how many KiB the cell keeps alive for its
backward beyond its inputs, parameters and outputs. Timing: every call timed on its own, as
benchmark.py does, but with time.perf_counter (benchmark.py reads time.time), the cells
interleaved round by round so that a drift of the machine hits all of them alike, and the
garbage collector off during the timed calls (as timeit has it). Unlike
benchmark.py, the backward starts from two fixed random gradients of new_h and new_cell
(benchmark.py calls (new_h.sum() + new_C.sum()).backward()), and the inputs X, h and C do not
require grad: the backward computes the gradients of the weights and the bias only, as when
the cell is a model's first layer (a stage that skips the input gradients when nobody asks for
them gains from this). A stage joins by a "cells" key in its TOUR:
{label: factory(input_features, state_size) -> module}; a "floors" key, the same kind of dict,
adds its cells that compute nothing to the rows of --floor.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import math
import statistics
import sys
import time

import torch
from torch._functorch import config as functorch_config  # check_cell: gradcheck of a compiled cell

from eml.common import lltm_checks
from eml.common.timing import cpu_name

# (batch, features, state): the tutorial's size, and a wide input.
SHAPES = [(16, 32, 128), (64, 1024, 128)]


def discover_cells(stages=None, key="cells"):
    """{label: factory} of every installed stage's TOUR "cells" (or another key: "floors"), in stage order."""
    if stages is None:
        points = importlib.metadata.entry_points(group="eml.tour")
        stages = [(p.name, p.load()) for p in sorted(points, key=lambda p: p.name)]
    cells = {}
    for _, tour in stages:
        cells.update(tour.get(key, {}))
    return cells


def _synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_cells(makers: dict, shape, *, runs=100, rounds=3, warmup=5, dtype=torch.float32, device="cpu", seed=0):
    """{label: (forward times, backward times)} in seconds, one entry per call.

    All cells get the same input, state and weights (copied from the first cell)."""
    # torch.compile keeps one cache per function, shared by every compiled cell of one class:
    # each new cell, shape, dtype or requires_grad adds an entry, and past the recompile limit
    # (8) a compiled cell runs eager without an error, only a logged warning. A reset gives each
    # shape a fresh cache, as a program that runs one shape has.
    torch._dynamo.reset()
    batch, features, state = shape
    generator = torch.Generator().manual_seed(seed)
    input, old_h, old_cell = (torch.randn(batch, n, generator=generator, dtype=dtype).to(device)
                              for n in (features, state, state))
    torch.manual_seed(seed)
    cells = {label: make(features, state).to(device=device, dtype=dtype) for label, make in makers.items()}
    first = next(iter(cells.values()))
    for cell in cells.values():
        cell.load_state_dict(first.state_dict())
    grads = [torch.randn(batch, state, generator=generator, dtype=dtype).to(device) for _ in range(2)]
    times = {label: ([], []) for label in cells}

    def one_call(cell, record):
        for p in cell.parameters():
            p.grad = None
        _synchronize(device)
        start = time.perf_counter()
        new_h, new_cell = cell(input, (old_h, old_cell))
        _synchronize(device)
        middle = time.perf_counter()
        torch.autograd.backward([new_h, new_cell], grads)
        _synchronize(device)
        end = time.perf_counter()
        if record is not None:
            record[0].append(middle - start)
            record[1].append(end - middle)

    for cell in cells.values():
        for _ in range(warmup):
            one_call(cell, None)
    # As timeit does: no garbage collection inside the timed calls. A compile in the warm-up
    # leaves many objects behind, and a full collection would land in one timed call (one
    # call of ~0.2 s seen in a Jupyter kernel on a Zen 5, which alone moved a 70 us average to 1.5 ms).
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for label, cell in cells.items():
                for _ in range(runs):
                    one_call(cell, times[label])
    finally:
        if collecting:
            gc.enable()
    return times


def saved_bytes(make_cell, shape, dtype=torch.float32, device="cpu"):
    """Bytes the cell keeps alive for its backward beyond its inputs, parameters and outputs
    (counted by storage, once each, with torch.autograd.graph.saved_tensors_hooks)."""
    batch, features, state = shape
    cell = make_cell(features, state).to(device=device, dtype=dtype)
    input, old_h, old_cell = (torch.randn(batch, n, dtype=dtype, device=device) for n in (features, state, state))
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outputs = cell(input.requires_grad_(), (old_h, old_cell))
    known = {t.untyped_storage().data_ptr() for t in (input, old_h, old_cell, *cell.parameters(), *outputs)}
    return sum(size for pointer, size in saved.items() if pointer not in known)


class _NothingComputed(torch.autograd.Function):
    """One autograd node that allocates what an LLTM cell returns and computes none of it."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        ctx.parameter_shapes = weights.shape, bias.shape
        return torch.empty_like(old_h), torch.empty_like(old_cell)

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        weights_shape, bias_shape = ctx.parameter_shapes
        return None, grad_h.new_empty(weights_shape), grad_h.new_empty(bias_shape), None, None


class FloorCell(torch.nn.Module):
    """Not an LLTM: a cell with the LLTM's parameters and interface whose one autograd node
    computes nothing (its outputs and gradients are allocated, never written). Timed with the
    same loop as the cells (--floor), its row is what a step costs around a cell's arithmetic:
    the module call, the node, autograd's engine, the gradients handed to the parameters.

    `node` is the node's apply: by default a Python autograd.Function, the floor of a cell whose
    node is Python (stages 09, 10: LLTMFunction). A stage whose node is C++ brings its own in its
    TOUR's "floors" (stage 17: a torch::autograd::Function that computes nothing), whose floor is
    lower: less Python in the forward, none in the backward (17's README measures both)."""

    def __init__(self, input_features, state_size, node=None):
        super().__init__()
        self.weights = torch.nn.Parameter(torch.zeros(3 * state_size, input_features + state_size))
        self.bias = torch.nn.Parameter(torch.zeros(3 * state_size))
        self.node = node if node is not None else _NothingComputed.apply

    def forward(self, input, state):
        new_h, new_cell = self.node(input, self.weights, self.bias, *state)
        return new_h, new_cell


FLOOR_LABEL = "floor (computes nothing)"  # the Python node's row


def format_us(values):
    return f"{min(values) * 1e6:.1f}/{statistics.fmean(values) * 1e6:.1f} us"


def benchmark(makers: dict, shapes=SHAPES, *, runs=100, rounds=3, device="cpu", out=print):
    """Print benchmark.py's lines for every cell and shape; return {(label, shape): (fwd, bwd)}."""
    results = {}
    width = max(len(label) for label in makers)
    baseline = next(iter(makers))
    for shape in shapes:
        out(f"  batch {shape[0]}, features {shape[1]}, state {shape[2]}:")
        times = time_cells(makers, shape, runs=runs, rounds=rounds, device=device)
        base_fwd, base_bwd = times[baseline]
        base_min = min(base_fwd) + min(base_bwd)
        base_avg = statistics.fmean(base_fwd) + statistics.fmean(base_bwd)
        for label, (fwd, bwd) in times.items():
            results[(label, shape)] = (fwd, bwd)
            speed_min = base_min / (min(fwd) + min(bwd))
            speed_avg = base_avg / (statistics.fmean(fwd) + statistics.fmean(bwd))
            kib = saved_bytes(makers[label], shape, device=device) / 1024
            out(f"    {label:<{width}}  Forward: {format_us(fwd)} | Backward: {format_us(bwd)} | "
                f"fwd+bwd x{speed_min:.2f} (min) x{speed_avg:.2f} (avg) | saved {kib:.0f} KiB")
    return results


def check_cell(make_cell, shape=lltm_checks.Shape(16, 32, 128), device="cpu"):
    """(ok, line): max errors in float32 against the reference, gradcheck in float64."""
    torch._dynamo.reset()  # a compiled cell is checked compiled, not past the recompile limit (time_cells)
    torch.manual_seed(0)
    cell = make_cell(shape.features, shape.state).to(device)
    arguments = lltm_checks.make_arguments(shape, torch.float32, device)
    arguments[1:3] = [cell.weights.detach(), cell.bias.detach()]
    actual = lltm_checks.outputs_and_grads(lltm_checks.module_as_function(cell), arguments)
    expected = lltm_checks.outputs_and_grads(lltm_checks.reference_lltm, arguments)
    errors = {name: (a - e).abs().max().item() for name, a, e in zip(lltm_checks.NAMES, actual, expected)}
    small = make_cell(4, 5).to(device=device, dtype=torch.float64)
    try:
        # gradcheck runs the backward once per output element (retain_graph=True). A cell under
        # torch.compile refuses that when AOTAutograd donates the backward's buffers (a memory
        # optimisation); the float64 graph gradcheck compiles is built without it.
        with functorch_config.patch(donated_buffer=False):
            verdict = "pass" if lltm_checks.gradcheck_cell(lltm_checks.module_as_function(small), device=device) else "FAIL"
    except Exception as error:  # gradcheck raises with the mismatching Jacobian
        verdict = f"FAIL ({str(error).splitlines()[0]})"
    worst = max(errors.values())
    ok = verdict == "pass" and worst < 1e-4 and not math.isnan(worst)
    short = {"new_h": "h", "new_cell": "c", "grad_input": "dx", "grad_weights": "dW", "grad_bias": "db",
             "grad_old_h": "dh", "grad_old_cell": "dc"}
    text = "  ".join(f"{short[name]} {value:.1e}" for name, value in errors.items())
    return ok, f"max|err| float32 {shape}: {text}; float64 gradcheck: {verdict}"


def header(runs, rounds, device="cpu"):
    where = cpu_name() if torch.device(device).type == "cpu" else torch.cuda.get_device_name()
    return (f"LLTM benchmark (the extension tutorial's): float32, {torch.get_num_threads()} threads, "
            f"{rounds} interleaved rounds x {runs} calls, min/avg per call; x = speed-up over the first cell; "
            f"{'CPU' if torch.device(device).type == 'cpu' else 'GPU'}: {where}")


def stage_ranges(names):
    """'09-11, 17' for the stage folders 09_..., 10_..., 11_..., 17_...: runs of consecutive numbers."""
    numbers = sorted({int(name[:2]) for name in names})
    runs = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(f"{a:02d}" if a == b else f"{a:02d}-{b:02d}" for a, b in runs)


def tour_section(stages, quick: bool) -> bool:
    """The tour's LLTM section: a correctness line per cell, then the benchmark."""
    makers = discover_cells(stages)
    if not makers:
        return True
    print(f"LLTM cells (stages {stage_ranges(name for name, stage in stages if stage.get('cells'))}): "
          "correctness against the reference (eml.common.lltm_checks)", flush=True)
    ok = True
    for label, make in makers.items():
        try:
            good, line = check_cell(make)
        except Exception as error:
            good, line = False, f"FAIL {error!r}"
        print(f"  {label}: {line}", flush=True)
        ok = ok and good
    runs, rounds = (20, 1) if quick else (100, 3)
    print(header(runs, rounds), flush=True)
    benchmark(makers, SHAPES[:1] if quick else SHAPES, runs=runs, rounds=rounds,
              out=lambda line: print(line, flush=True))
    return ok


def parse_shape(text):
    """'B,F,S' -> (batch, features, state), three integers >= 1 (argparse's type for --shape)."""
    try:
        shape = tuple(int(value) for value in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"wants three integers >= 1 as batch,features,state, got '{text}'")
    return shape


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tutorial's shape only, few calls")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) first")
    parser.add_argument("--runs", type=int, default=100, help="calls per cell per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for a GPU stage")
    parser.add_argument("--floor", action="store_true", help="add last rows: FloorCell, a cell that computes "
                        "nothing (what a step costs around a cell's arithmetic), and the stages' own (a C++ node)")
    parser.add_argument("--shape", type=parse_shape, default=None, metavar="B,F,S",
                        help="time this (batch, features, state) instead of the two shapes (1,1,1: next to nothing "
                        "to compute)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    makers = discover_cells()
    if not makers:
        print("no LLTM stage is installed: pip install --no-build-isolation ./09_lltm_python (and 10, 11)")
        return 1
    if args.floor:
        makers[FLOOR_LABEL] = FloorCell
        makers.update(discover_cells(key="floors"))
    runs, rounds = (20, 1) if args.quick else (args.runs, args.rounds)
    print(header(runs, rounds, args.device), flush=True)
    shapes = [args.shape] if args.shape else SHAPES[:1] if args.quick else SHAPES
    benchmark(makers, shapes, runs=runs, rounds=rounds, device=args.device, out=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
