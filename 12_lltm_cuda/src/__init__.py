"""Stage 12 of "From PyTorch to Machine Code": the LLTM cell with fused CUDA kernels.

Imports without CUDA (the module and its parameters exist everywhere); running the cell needs
the compiled module, i.e. a CUDA build of torch, a GPU and this stage installed.
"""

from .lltm import LLTM, LLTMFunction

__all__ = ["LLTM", "LLTMFunction"]

# How this stage joins the tour (`python -m eml.common.tour`) where it is installed (a GPU
# machine): setup.py names this dict as an entry point in the group "eml.tour".
TOUR = {}
