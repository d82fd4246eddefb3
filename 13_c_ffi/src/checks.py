"""Stage 13: the tour's correctness line (python -m eml.common.tour), one check per lesson.

What this stage teaches: see clib.py, layer.py and ops.py; this file only reports them.
What changed: a new route, not a copy of an earlier stage (README).
Run it: ``python -c "from eml.c_ffi import tour_check; print(tour_check())"``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import clib, ops
from .layer import AddModule, Layer, LinearFunction


def tour_check() -> tuple[bool, str]:
    """(ok, line): model(x, 4x) == 5x, the linear against F.linear, gradcheck, bad inputs stopped before C."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, generator=generator)
    add_ok = torch.equal(AddModule()(x, 4 * x), 5 * x)

    layer = Layer(61, 53)
    input = torch.randn(37, 61, generator=generator)
    linear_error = (layer(input) - F.linear(input, layer.weight, layer.bias)).abs().max().item()

    leaves = [torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)
              for shape in ((2, 3, 5), (4, 5), (4,))]
    grad_ok = (torch.autograd.gradcheck(LinearFunction.apply, leaves)
               and torch.autograd.gradcheck(ops.linear, leaves)
               and torch.autograd.gradcheck(ops.add, [leaves[1], torch.randn(4, 5, generator=generator, dtype=torch.float64, requires_grad=True)]))

    bad = [lambda: clib.add_forward(torch.ones(4), torch.ones(5)),                 # shapes differ
           lambda: clib.add_forward(torch.ones(4), torch.ones(4, dtype=torch.float64)),  # dtypes differ
           lambda: clib.add_forward(torch.ones(4, dtype=torch.int32), torch.ones(4, dtype=torch.int32)),
           lambda: clib.add_forward(torch.ones(3, 4).t(), torch.ones(3, 4).t()),   # not contiguous
           lambda: clib.add_forward(torch.ones(4, device="meta"), torch.ones(4, device="meta")),
           lambda: clib.linear_forward(torch.ones(2, 3), torch.ones(4, 5))]         # features differ
    before, stopped = clib.calls(), 0
    for call in bad:
        try:
            call()
        except (TypeError, ValueError):
            stopped += 1
    reached = clib.calls() - before
    ok = add_ok and linear_error < 1e-4 and grad_ok and stopped == len(bad) and reached == 0
    return ok, (f"model(x, 4x) == 5x: {'yes' if add_ok else 'NO'}; linear 37x61x53 vs F.linear max|err| "
                f"{linear_error:.1e}; float64 gradcheck (Function and custom op): {'pass' if grad_ok else 'FAIL'}; "
                f"bad inputs stopped in Python: {stopped}/{len(bad)}, C calls made by them: {reached}")
