"""Stage 13 of "From PyTorch to Machine Code": a plain C library called from PyTorch through ctypes."""

from . import clib, ops
from .checks import tour_check
from .layer import AddFunction, AddModule, Layer, LinearFunction, add, linear

__all__ = ["AddFunction", "AddModule", "Layer", "LinearFunction", "add", "clib", "linear", "ops", "tour_check"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". "checks": the lessons of this stage in one line (checks.py).
TOUR = {"checks": {"13 c ffi": tour_check}}
