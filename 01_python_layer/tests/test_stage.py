"""Stage 01's tests: the shared contract of a torch.nn.Linear drop-in (common/), and the
checks that only this stage needs."""

import torch

from eml.common.checks import LayerTests, assert_close
from eml.ext.linear_python import Layer


class TestLayer(LayerTests):
    make_layer = staticmethod(Layer)
    double_backward = True  # autograd derived the backward from differentiable operations


def test_same_initialisation_as_nn_linear_for_the_same_seed():
    torch.manual_seed(7)
    reference = torch.nn.Linear(10, 4)
    torch.manual_seed(7)
    layer = Layer(10, 4)
    assert_close(layer.weight, reference.weight, torch.float32, "weight")
    assert_close(layer.bias, reference.bias, torch.float32, "bias")
