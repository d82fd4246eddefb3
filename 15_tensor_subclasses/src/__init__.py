"""Stage 15 of "From PyTorch to Machine Code": extending torch itself with __torch_function__ and __torch_dispatch__."""

from . import coverage
from .checks import tour_check
from .dispatch_log import LoggingMode, LoggingTensor, dispatched_ops, logged_ops, matrix_products, subclass_ops
from .scalar_tensor import HANDLED_FUNCTIONS, ScalarTensor, ensure_tensor, implements
from .subclasses import KeepsType, TaggedTensor, Wrapper, tagged

__all__ = [
    "HANDLED_FUNCTIONS", "KeepsType", "LoggingMode", "LoggingTensor", "ScalarTensor", "TaggedTensor", "Wrapper",
    "coverage", "dispatched_ops", "ensure_tensor", "implements", "logged_ops", "matrix_products", "subclass_ops",
    "tagged", "tour_check",
]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". "checks": this stage's lessons in one line (checks.py).
TOUR = {"checks": {"15 tensor subclasses": tour_check}}
