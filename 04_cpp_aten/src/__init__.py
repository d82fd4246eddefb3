"""Stage 04 of "From PyTorch to Machine Code": forward and backward in C++, the products by ATen."""

from .layer import Function, Layer

__all__ = ["Function", "Layer"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". Each label maps to a factory (in, out, bias=True).
TOUR = {"layers": {"04 cpp aten": Layer}}
