"""Stages 06, 07, 08 and 16 share their C++ namespace (tpp), so that the diff between them is the
lesson. Their compiled modules must still live side by side in one process, as they do in the
tour: each keeps its own symbols (-fvisibility=hidden) and its own pybind11 class
(py::module_local). Run in a fresh interpreter, so that the import order is the one below."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from eml.linear_tpp import Layer as Layer06, _C as C06
    from eml.linear_tpp_bf16 import Layer as Layer07, _C as C07
    from eml.linear_op import Layer as Layer08
    from eml.linear_stable import Layer as Layer16

    assert C06.LinearState is not C07.LinearState, "one pybind11 class for two stages"
    s06, s07 = C06.LinearState(5, 3), C07.LinearState(5, 3)
    assert "bf16_path" in repr(s07) and "bf16_path" not in repr(s06), (repr(s06), repr(s07))
    x = torch.randn(4, 5, dtype=torch.float64)
    for Layer in (Layer06, Layer07, Layer08, Layer16):
        layer = Layer(5, 3).double()
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    print("ok")
""")


def test_stages_06_07_08_16_load_into_one_process():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
