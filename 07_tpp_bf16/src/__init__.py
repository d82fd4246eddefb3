"""Stage 07 of "From PyTorch to Machine Code": the linear layer in bfloat16 on LIBXSMM's VNNI kernels."""

from .layer import Function, Layer, bf16_path, peak_gflops, peak_gflops_bf16

__all__ = ["Function", "Layer", "bf16_path", "peak_gflops", "peak_gflops_bf16"]


def check_float32():
    """The tour's float32 correctness line for this stage (its float32 path is stage 06's)."""
    from eml.common.tour import check_layer  # the tour's own line: max errors, float64 gradcheck

    return check_layer(Layer, (64, 256, 256))


# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". Its float32 path is stage 06's, so it adds no float32
# timing rows, only a correctness line ("checks"); "bf16_layers" puts it in the bfloat16 table
# (common/eml/common/tour_bf16.py), with the bf16 peak probe where this CPU has bf16 kernels.
TOUR = {
    "checks": {"07 tpp bf16 float32": check_float32},
    "bf16_layers": {"07 tpp bf16": Layer},
    "peak_gflops_bf16": peak_gflops_bf16,
    "bf16_path": bf16_path,
}
