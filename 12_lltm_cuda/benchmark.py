"""Stage 12's benchmark: the LLTM cell of stages 09 (Python), 10 (C++ on ATen) and 12 (fused
CUDA kernels) on one GPU, in the format of the tutorial's benchmark.py.

    python 12_lltm_cuda/benchmark.py                 # every size below, float32, 500 runs each
    python 12_lltm_cuda/benchmark.py --runs 100 --sizes 16,32,128 64,1024,128

Every stage that is installed and accepts CUDA tensors is first checked against stage 09's
module + autograd (outputs and all five gradients), then timed: one forward, then one backward
of (new_h.sum() + new_cell.sum()), each followed by torch.cuda.synchronize() so the time is the
GPU's work and not only the launch (a timer read right after an asynchronous launch measures
nothing). Reported: min and average microseconds over the runs, the tutorial's two figures,
and the median forward+backward as a speed-up over 09. Without a GPU it stops with one line.
Measure on a quiet GPU; figures belong to the GPU and the torch/CUDA versions printed first.
"""

import argparse
import importlib
import statistics
import sys
import time

import torch

# (batch, input features, state size): the tutorial's size, the project's second LLTM size,
# and two larger ones where the GPU has enough work to be busy.
SIZES = [(16, 32, 128), (64, 1024, 128), (256, 1024, 1024), (1024, 2048, 2048)]
STAGES = [("09 python", "eml.lltm_python"), ("10 cpp", "eml.lltm_cpp"), ("12 cuda", "eml.lltm_cuda")]


def cells(features, state, device, dtype):
    """{label: LLTM module} for every installed stage, all with stage 09's parameters."""
    found, reference = {}, None
    for label, name in STAGES:
        try:
            package = importlib.import_module(name)
        except ImportError as error:
            print(f"  {label}: not installed ({error})")
            continue
        torch.manual_seed(0)
        cell = package.LLTM(features, state).to(device=device, dtype=dtype)
        if reference is None:
            reference = cell
        else:
            cell.load_state_dict(reference.state_dict())
        found[label] = cell
    return found


def run(cell, input, state):
    new_h, new_cell = cell(input, state)
    return new_h, new_cell


def outputs_and_grads(cell, input, old_h, old_cell):
    tensors = [t.detach().clone().requires_grad_() for t in (input, old_h, old_cell)]
    cell.zero_grad()
    new_h, new_cell = run(cell, tensors[0], (tensors[1], tensors[2]))
    (new_h.sum() + new_cell.sum()).backward()
    return [new_h, new_cell] + [t.grad for t in tensors] + [p.grad for p in cell.parameters()]


def max_error(cell, reference, input, old_h, old_cell):
    ours = outputs_and_grads(cell, input, old_h, old_cell)
    theirs = outputs_and_grads(reference, input, old_h, old_cell)
    return max((a.double() - b.double()).abs().max().item() for a, b in zip(ours, theirs))


def time_cell(cell, input, old_h, old_cell, runs):
    """Lists of forward and backward times in microseconds, the device synchronised after each."""
    input, old_h, old_cell = (t.detach().clone().requires_grad_() for t in (input, old_h, old_cell))
    forward, backward = [], []
    for step in range(runs + runs // 10):  # the first tenth warms up (allocator, cuBLAS handles)
        torch.cuda.synchronize()
        start = time.perf_counter()
        new_h, new_cell = run(cell, input, (old_h, old_cell))
        torch.cuda.synchronize()
        middle = time.perf_counter()
        (new_h.sum() + new_cell.sum()).backward()
        torch.cuda.synchronize()
        end = time.perf_counter()
        if step >= runs // 10:
            forward.append((middle - start) * 1e6)
            backward.append((end - middle) * 1e6)
    return forward, backward


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500, help="timed runs per stage and size")
    parser.add_argument("--sizes", nargs="*", default=None, help="batch,features,state triples")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = parser.parse_args(argv)
    if torch.version.cuda is None or not torch.cuda.is_available():
        sys.exit(f"benchmark.py: needs a GPU and a CUDA build of torch; this is torch {torch.__version__} "
                 f"(torch.version.cuda={torch.version.cuda}, GPU visible: {torch.cuda.is_available()}), nothing timed")
    sizes = [tuple(int(x) for x in size.split(",")) for size in args.sizes] if args.sizes else SIZES
    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda")
    print(f"LLTM benchmark on {torch.cuda.get_device_name(device)}: torch {torch.__version__}, CUDA "
          f"{torch.version.cuda}, {args.dtype}, {args.runs} runs, device synchronised after each pass")
    ok = True
    for batch, features, state in sizes:
        print(f"\nbatch {batch}, features {features}, state {state}")
        generator = torch.Generator(device="cpu").manual_seed(1)
        input, old_h, old_cell = (torch.randn(batch, n, generator=generator, dtype=dtype).to(device)
                                  for n in (features, state, state))
        found = cells(features, state, device, dtype)
        reference = found.get("09 python")
        baseline = None
        for label, cell in found.items():
            try:
                error = 0.0 if cell is reference else max_error(cell, reference, input, old_h, old_cell)
            except RuntimeError as failure:  # e.g. a CPU-only stage refusing CUDA tensors
                print(f"  {label:10s} skipped: {str(failure).splitlines()[0]}")
                continue
            tolerance = 1e-4 if dtype == torch.float32 else 1e-10
            if error > tolerance * max(1.0, features ** 0.5):
                print(f"  {label:10s} WRONG: max|error| {error:.1e} against 09; not timed")
                ok = False
                continue
            forward, backward = time_cell(cell, input, old_h, old_cell, args.runs)
            total = statistics.median(f + b for f, b in zip(forward, backward))
            baseline = baseline or (total if label == "09 python" else None)
            speedup = f"{baseline / total:5.2f}x vs 09" if baseline else "  (no 09)"
            print(f"  {label:10s} Forward: {min(forward):8.1f}/{statistics.mean(forward):8.1f} us | "
                  f"Backward {min(backward):8.1f}/{statistics.mean(backward):8.1f} us | "
                  f"f+b median {total:8.1f} us {speedup} | max|err| {error:.1e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
