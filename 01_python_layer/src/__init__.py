"""Stage 01 of "From PyTorch to Machine Code": a linear layer as a plain nn.Module."""

from .layer import Layer

__all__ = ["Layer"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". Each label maps to a factory (in, out, bias=True).
TOUR = {"layers": {"01 python layer": Layer}}
