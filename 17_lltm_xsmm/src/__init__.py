"""Stage 17 of "From PyTorch to Machine Code": the fused LLTM cell, its GEMMs on LIBXSMM's kernels."""

from .lltm import LLTM, LLTMFunction, floor_cell

__all__ = ["LLTM", "LLTMFunction", "floor_cell"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". "cells": {label: factory(input_features, state_size)},
# read by eml.common.lltm_bench (the LLTM benchmark); "floors", the same for its --floor rows.
TOUR = {"cells": {"17 xsmm (LIBXSMM GEMMs)": LLTM}, "floors": {"floor, C++ node (computes nothing)": floor_cell}}
