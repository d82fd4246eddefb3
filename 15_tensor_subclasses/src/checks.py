"""Stage 15: the tour's correctness line (python -m eml.common.tour), one check per lesson.

What this stage teaches: see scalar_tensor.py, subclasses.py, coverage.py and dispatch_log.py.
What changed: a new route, not a copy of an earlier stage (README).

Run it: ``python -c "from eml.tensor_subclasses import tour_check; print(tour_check())"``.
"""

from __future__ import annotations

import torch

from . import coverage
from .dispatch_log import dispatched_ops
from .scalar_tensor import ScalarTensor
from .subclasses import KeepsType, Wrapper


def tour_check() -> tuple[bool, str]:
    """(ok, line): ScalarTensor's torch.mean and its refusals, a subclass keeping its type,
    a wrapper, the coverage API, and the ATen operators of torch.nn.Linear."""
    s = ScalarTensor(5, 2.0)
    mean_ok = torch.allclose(torch.mean(s), torch.mean(s.tensor()))
    try:
        torch.exp(s)  # not handled: NotImplemented, then torch's TypeError
        refuses = False
    except TypeError:
        refuses = True
    x = torch.randn(3, 4).as_subclass(KeepsType)
    keeps = all(type(t) is KeepsType for t in (x + 1, torch.relu(x), x.sum(), x @ x.t()))
    wrapped = type(torch.nn.functional.relu(Wrapper(torch.randn(3)))) is Wrapper
    signatures_ok = not coverage.missing_parameters()
    forward, _ = dispatched_ops(torch.nn.Linear(4, 3), torch.randn(2, 4))
    ok = mean_ok and refuses and keeps and wrapped and signatures_ok and forward == ["aten.t.default", "aten.addmm.default"]
    return ok, (f"ScalarTensor torch.mean: {'ok' if mean_ok else 'WRONG'}, torch.exp refused: {'yes' if refuses else 'NO'}; "
                f"subclass keeps its type: {'yes' if keeps else 'NO'}; wrapper: {'ok' if wrapped else 'FAIL'}; "
                f"override signatures: {'ok' if signatures_ok else 'MISSING'}; nn.Linear dispatches {' + '.join(forward)}")
