"""Stage 15: __torch_dispatch__, the ATen operators a model really runs.

What this stage teaches: below torch's Python API, every call goes through the dispatcher as
ATen operators (``aten.mm.default``, ``aten.addmm.default``, ...). ``__torch_dispatch__`` is the
hook at the dispatcher's Python key, below autograd: a composite operator whose kernel is
CompositeImplicitAutograd runs above that key and shows as the operators it calls
(``aten::linear`` is dispatched, and its kernel calls ``t`` + ``addmm``). Two ways to use it:

  LoggingMode       a TorchDispatchMode: while it is active, every operator call that reaches
                    the dispatcher's Python key is logged, from Python or from C++ (an
                    extension's own at::empty), whatever tensors it runs on (a composite such
                    as aten::linear shows as the operators its kernel calls). A registered operator
                    (torch.library) shows as one entry: the mode does not see inside it.
  LoggingTensor     a wrapper subclass (no memory of its own, it holds ``elem``): it logs only
                    the operators that touch it (not the ``t`` of a weight), and code that
                    needs raw memory (a C++ or C extension's data pointer) cannot run on it.

``dispatched_ops(module, input)`` runs a forward and a backward under LoggingMode and returns
both lists: the notebook and the tests apply it to the tutorial's own stages.
What changed: a new route (README). Run it:
``python -c "import torch; from eml.tensor_subclasses import dispatched_ops; print(dispatched_ops(torch.nn.Linear(3, 2), torch.randn(4, 3)))"``.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only


class LoggingMode(TorchDispatchMode):
    """Logs every operator dispatched while active: ``with LoggingMode() as mode: ...; mode.ops``."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))  # e.g. 'aten.addmm.default': namespace.operator.overload
        return func(*args, **(kwargs or {}))  # runs the operator (the mode is off inside)


class LoggingTensor(torch.Tensor):
    """A wrapper subclass: shape, dtype and strides of ``elem``, no storage; logs the operators it meets."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, log: list):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, device=elem.device, requires_grad=elem.requires_grad,
        )
        wrapper.elem = elem
        wrapper.log = log
        return wrapper

    def __repr__(self):
        return f"LoggingTensor({self.elem!r})"

    # No __torch_function__ level for this class: the Python API runs as for a plain tensor.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        log = next(a.log for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, LoggingTensor))
        log.append(str(func))
        args, kwargs = tree_map_only(LoggingTensor, lambda t: t.elem, (args, kwargs or {}))
        result = func(*args, **kwargs)
        return tree_map_only(torch.Tensor, lambda t: LoggingTensor(t, log), result)


def logged_ops(fn, *args, **kwargs) -> tuple[object, list]:
    """(fn(*args, **kwargs), the operators it dispatched)."""
    with LoggingMode() as mode:
        result = fn(*args, **kwargs)
    return result, mode.ops


def dispatched_ops(module: torch.nn.Module, input: torch.Tensor) -> tuple[list, list]:
    """(forward operators, backward operators) of one training step's module call.

    The backward is ``torch.autograd.grad`` of the output against the input and every
    parameter that requires a gradient, with a given grad_output: no ``.grad`` accumulation
    (whose ops would depend on what ran before), the same list on every run.
    """
    input = input.detach().requires_grad_()
    leaves = [input] + [p for p in module.parameters() if p.requires_grad]
    with LoggingMode() as forward:
        output = module(input)
    grad_output = torch.ones_like(output)
    with LoggingMode() as backward:
        torch.autograd.grad(output, leaves, grad_output)
    return forward.ops, backward.ops


def subclass_ops(module: torch.nn.Module, input: torch.Tensor) -> list:
    """The operators a LoggingTensor input meets in a forward (the parameters stay plain tensors)."""
    log = []
    module(LoggingTensor(input, log))
    return log


def matrix_products(ops: list) -> list:
    """The ATen matrix products among ``ops``: what a GEMM inside C++ would have to show."""
    names = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "aten.matmul.", "aten.linear.", "aten.dot.", "aten.mv.")
    return [op for op in ops if op.startswith(names)]
