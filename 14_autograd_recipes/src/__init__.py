"""Stage 14 of "From PyTorch to Machine Code": autograd recipes, in pure Python.

- MulConstant: ``ctx.set_materialize_grads(False)``, a backward that accepts None;
- Cube, CubeWrong, CubeWithBackwardFunction: double backward, and gradgradcheck catching the
  wrong one;
- Conv2dFunction, BatchNormFunction, FusedConvBNFunction, FusedConvBN: convolution + batch norm
  fused into one Function that saves less for backward; ``python -m eml.autograd_recipes.memory``
  measures how much less.

What changed since stage 02 (the Function contract): setup_context and set_materialize_grads,
create_graph and gradgradcheck, once_differentiable, saved-tensor hooks, recomputation traded
for memory. Pure Python: ``pip install --no-build-isolation .`` here, then ``pytest tests``.
"""

from .conv_bn import BatchNormFunction, Conv2dFunction, FusedConvBN, FusedConvBNFunction
from .cube import Cube, CubeBackward, CubeWithBackwardFunction, CubeWrong
from .mul_constant import MulConstant

__all__ = ["MulConstant", "Cube", "CubeWrong", "CubeBackward", "CubeWithBackwardFunction",
           "Conv2dFunction", "BatchNormFunction", "FusedConvBNFunction", "FusedConvBN"]


def _tour_checks():
    from . import conv_bn, cube, mul_constant
    return {"14 MulConstant": mul_constant.tour_check, "14 Cube double backward": cube.tour_check,
            "14 fused conv+BN": conv_bn.tour_check}


# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". This stage has no linear layer: correctness lines only.
TOUR = {"checks": _tour_checks()}
