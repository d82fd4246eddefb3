"""Stage 12's benchmark: every installed LLTM cell that runs on a GPU, timed on the GPU in the
format of pytorch/extension-cpp's benchmark.py, with the device synchronised around every timed pass.

    python 12_lltm_cuda/benchmark.py                  # 4 shapes, 3 interleaved rounds x 100 calls
    python 12_lltm_cuda/benchmark.py --quick          # the tutorial's shape, a few calls
    python 12_lltm_cuda/benchmark.py --shapes 64,1024,128 1024,2048,2048 --runs 300

It is common/'s LLTM benchmark (eml.common.lltm_bench, the one the tour runs on the CPU) run
with device="cuda": every call is timed on its own with time.perf_counter, with
torch.cuda.synchronize() before the clock is read at the start, between forward and backward
and at the end (a launch returns before the GPU has done the work: without the
synchronisation the clock measures the launch, not the kernel). The cells are the "cells" of
every installed stage (09, 10, 11, 17) and this stage's "cuda_cells"; each is first checked on the
GPU against common/'s reference (outputs and the five gradients in float32, gradcheck in
float64). A CPU stage's cell that refuses CUDA tensors (11's and 17's passes are CPU code) is
named and left out; a cell that fails the check is reported and left out, and the script
then exits 1, as it does (with the traceback) when any other error is raised. The first cell
timed is stage 09's nn.Module: every "x" is a speed-up over it. Without a GPU it stops with one line.
"""

import argparse
import importlib
import importlib.metadata
import sys

import torch

# (batch, features, state): the tutorial's size, lltm_bench's second shape, and two sizes where
# the element-wise work is large enough to keep a GPU busy.
SHAPES = [(16, 32, 128), (64, 1024, 128), (256, 1024, 1024), (1024, 2048, 2048)]


def gpu_cells(kind=None):
    """{label: factory} of every installed LLTM stage: "cells" (CPU stages) and "cuda_cells", or
    only those of kind."""
    points = importlib.metadata.entry_points(group="eml.tour")
    cells = {}
    for point in sorted(points, key=lambda p: p.name):
        tour = point.load()
        for key in ("cells", "cuda_cells"):
            if kind in (None, key):
                cells.update(tour.get(key, {}))
    return cells


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tutorial's shape only, few calls")
    parser.add_argument("--runs", type=int, default=100, help="calls per cell per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--shapes", nargs="*", default=None, help="batch,features,state triples")
    args = parser.parse_args(argv)
    if torch.version.cuda is None or not torch.cuda.is_available():
        sys.exit(f"benchmark.py: needs a GPU and a CUDA build of torch; this is torch {torch.__version__} "
                 f"(torch.version.cuda={torch.version.cuda}, GPU visible: {torch.cuda.is_available()}), nothing timed")
    from eml.common import lltm_bench  # imported here: the line above must not need eml.common

    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] if args.shapes else SHAPES
    runs, rounds = (20, 1) if args.quick else (args.runs, args.rounds)
    if args.quick:
        shapes = shapes[:1]
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: {torch.cuda.get_device_name()}", flush=True)
    print("correctness on the GPU against common/'s reference:", flush=True)
    makers, ok = {}, True
    cuda_labels = set(gpu_cells(kind="cuda_cells"))
    for label, make in gpu_cells().items():
        try:
            good, line = lltm_bench.check_cell(make, device="cuda")
        except RuntimeError as error:
            refused = "must be a CPU tensor" in str(error) and label not in cuda_labels
            if not refused:  # a GPU cell, or any other error: a failure, not a refusal
                raise
            # A CPU-only stage refusing CUDA tensors (stage 11's fused pass): say why, leave it out.
            print(f"  {label}: not timed ({str(error).splitlines()[0]})", flush=True)
            continue
        print(f"  {label}: {line}", flush=True)
        if good:
            makers[label] = make
        ok = ok and good
    if not makers:
        print("no LLTM cell runs on this GPU: install 09_lltm_python and 12_lltm_cuda")
        return 1
    print(lltm_bench.header(runs, rounds, device="cuda"), flush=True)
    lltm_bench.benchmark(makers, shapes, runs=runs, rounds=rounds, device="cuda",
                         out=lambda line: print(line, flush=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
