"""Stage 06 of "From PyTorch to Machine Code": forward and backward on LIBXSMM's JIT-generated kernels."""

from .layer import Function, Layer, peak_gflops

__all__ = ["Function", "Layer", "peak_gflops"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". Each label maps to a factory (in, out, bias=True);
# "peak_gflops" makes the tour's table show every GFLOP/s figure also as a % of the peak.
TOUR = {"layers": {"06 tpp": Layer}, "peak_gflops": peak_gflops}
