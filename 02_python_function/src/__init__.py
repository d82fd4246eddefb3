"""Stage 02 of "From PyTorch to Machine Code": a torch.autograd.Function with a hand-written backward."""

from .layer import Function, Layer

__all__ = ["Function", "Layer"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". Each label maps to a factory (in, out, bias=True).
TOUR = {"layers": {"02 python function": Layer}}
