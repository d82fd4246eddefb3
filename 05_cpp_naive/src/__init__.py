"""Stage 05 of "From PyTorch to Machine Code": forward and backward as our own C++ loops."""

import functools

from .layer import Function, Layer

__all__ = ["Function", "Layer"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". Each label maps to a factory (in, out, bias=True);
# both loop orders are timed, so the tour shows what the loop order is worth.
TOUR = {
    "layers": {
        "05 naive cache-aware": Layer,
        "05 naive textbook": functools.partial(Layer, loop_order="textbook"),
    }
}
