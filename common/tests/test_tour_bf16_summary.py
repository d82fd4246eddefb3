"""The bf16 section's verdict line: the float32 goal depends on whether the layer runs native bf16
kernels (1.5x torch.nn.Linear in float32) or not (0.75x); both also need 1.1x torch's bf16."""

import pytest

from eml.common.timing import Timing
from eml.common.tour_bf16 import TORCH_BF16, TORCH_FP32, summary


def results(fp32_us, bf16_us, layer_us, label="layer"):
    shape = (8, 16, 32)
    return [Timing(TORCH_FP32, shape, 1.0, 0.0, fp32_us, 0.0), Timing(TORCH_BF16, shape, 1.0, 0.0, bf16_us, 0.0),
            Timing(label, shape, 1.0, 0.0, layer_us, 0.0)]


@pytest.mark.parametrize("layer_us, native, verdict", [
    (120.0, False, "met"),     # 0.83x float32 without native bf16 kernels
    (140.0, False, "missed"),  # 0.71x
    (120.0, True, "missed"),   # native kernels must reach 1.5x
    (60.0, True, "met"),       # 1.67x
])
def test_float32_goal_follows_the_kernels(layer_us, native, verdict):
    line = summary(results(100.0, 1000.0, layer_us), "layer", native=native)
    assert line.endswith(f": {verdict}"), line
    assert (">= 1.5x fp32 with native" if native else ">= 0.75x fp32 without native") in line


def test_slower_than_torch_bf16_misses():
    line = summary(results(100.0, 50.0, 60.0), "layer", native=True)  # 1.67x fp32 but 0.83x bf16
    assert line.endswith(": missed"), line
