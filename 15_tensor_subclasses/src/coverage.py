"""Stage 15: the override-coverage API, torch.overrides, applied to ScalarTensor.

What this stage teaches: torch lists what ``__torch_function__`` can override, so that a
type's coverage can be measured and its implementations checked against torch's signatures:

    torch.overrides.get_overridable_functions()  {namespace: [functions]}: every function
                                                 (torch.*, torch.nn.functional.*, Tensor
                                                 methods) that checks __torch_function__
    torch.overrides.get_testing_overrides()      {function: dummy lambda with its signature}
    torch.overrides.get_ignored_functions()      functions that never check it (torch.tensor, ...)

What changed: a new route (README). Run it:
``python -c "from eml.tensor_subclasses import coverage; print(coverage.report())"``.
"""

from __future__ import annotations

import inspect

import torch
from torch.overrides import get_ignored_functions, get_overridable_functions, get_testing_overrides

from .scalar_tensor import HANDLED_FUNCTIONS


def overridable_in_torch() -> set:
    """The functions of the top-level ``torch`` namespace that __torch_function__ can override."""
    return set(get_overridable_functions()[torch])


def missing_parameters(handled: dict = HANDLED_FUNCTIONS) -> dict:
    """{function name: [parameters of torch's signature that our implementation does not accept]}.

    Empty when every implementation accepts every parameter of the reference signature: the
    dummy lambda torch keeps for testing overrides. That stand-in is not always the whole public
    signature: torch.add's is (input, other, out=None), without alpha, so a missing alpha is
    for a test to catch (tests/test_stage.py: test_add_honours_alpha).
    """
    dummies = get_testing_overrides()
    problems = {}
    for func, implementation in handled.items():
        if func not in dummies:
            problems[func.__name__] = ["<not overridable: torch never asks __torch_function__>"]
            continue
        ours = inspect.signature(implementation, follow_wrapped=False).parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in ours.values())
        theirs = inspect.signature(dummies[func]).parameters
        missing = [name for name in theirs if name not in ours and not takes_kwargs]
        if missing:
            problems[func.__name__] = missing
    return problems


def report(handled: dict = HANDLED_FUNCTIONS) -> str:
    """One line: which overridable functions of torch the type handles, and whether the signatures fit.

    No total in the line: torch computes its list once, on the first call, from the torch
    namespace as it is then (500 functions in torch 2.13.0 in every process we counted), so a
    total would describe the process, not the type.
    """
    overridable = overridable_in_torch()
    covered = sorted(f"torch.{f.__name__}" for f in handled if f in overridable)
    missing = missing_parameters(handled)
    signatures = f"missing {missing}" if missing else "every parameter of torch's testing signatures accepted"
    return f"handles {len(covered)} overridable functions of torch ({', '.join(covered)}); signatures: {signatures}"


def is_ignored(func) -> bool:
    """True for functions that never consult __torch_function__ (e.g. torch.tensor, torch.empty's factories)."""
    return func in get_ignored_functions()
