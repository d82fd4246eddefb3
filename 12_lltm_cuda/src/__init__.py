"""Stage 12 of "From PyTorch to Machine Code": the LLTM cell with fused CUDA kernels.

Imports without CUDA (the module and its parameters exist everywhere); running the cell needs
the compiled module, i.e. a CUDA build of torch, a GPU and this stage installed.
"""

from .lltm import LLTM, LLTMFunction

__all__ = ["LLTM", "LLTMFunction"]


def _check_on_the_gpu():
    """(ok, line): the cell on the GPU against common/'s reference, gradcheck in float64."""
    from eml.common import lltm_bench  # imported when the tour runs the check, not with the package

    return lltm_bench.check_cell(LLTM, device="cuda")


# How this stage joins the tour (`python -m eml.common.tour`) where it is installed, i.e. on a
# GPU machine: setup.py names this dict as an entry point in the group "eml.tour".
#   "checks":     a correctness line on the GPU;
#   "cuda_cells": {label: factory(input_features, state_size)}, cells that run on CUDA tensors
#                 only, for benchmark.py (the "cells" key of stages 09-11 is timed on the CPU,
#                 where this cell cannot run).
TOUR = {
    "checks": {"12 cuda (fused kernels) on the GPU": _check_on_the_gpu},
    "cuda_cells": {"12 cuda (fused kernels)": LLTM},
}
