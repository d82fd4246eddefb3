"""Stage 09 of "From PyTorch to Machine Code": the LLTM cell in Python (autograd, and by hand)."""

from .lltm import LLTM, LLTMFunction, LLTMWithFunction, compiled_lltm

__all__ = ["LLTM", "LLTMFunction", "LLTMWithFunction", "compiled_lltm"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". "cells": {label: factory(input_features, state_size)},
# read by eml.common.lltm_bench (the LLTM benchmark); the first label is every speed-up's baseline.
TOUR = {"cells": {"09 python (autograd)": LLTM, "09 python (LLTMFunction)": LLTMWithFunction,
                  "09 python (torch.compile)": compiled_lltm}}
