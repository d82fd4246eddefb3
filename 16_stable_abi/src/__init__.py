"""Stage 16 of "From PyTorch to Machine Code": stage 08's operators on LibTorch's stable ABI."""

from . import ops
from .layer import Layer, peak_gflops
from .ops import backward, forward

__all__ = ["Layer", "backward", "forward", "ops", "peak_gflops"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". Each label maps to a factory (in, out, bias=True);
# "peak_gflops" makes the tour's table show every GFLOP/s figure also as a % of the peak.
# "compile_layers": layers that torch.compile can compile whole: eml.common.tour_compile times
# an MLP of them against the same MLP on nn.Linear, both compiled (float32 and bfloat16).
TOUR = {"layers": {"16 stable ABI": Layer}, "compile_layers": {"16 stable ABI": Layer}, "peak_gflops": peak_gflops}
