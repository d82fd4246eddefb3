"""Stage 15: a torch.Tensor subclass that keeps its type, and a wrapper type that is no tensor.

What this stage teaches: the two other shapes ``__torch_function__`` takes.

  KeepsType(torch.Tensor)   a subclass with no hook of its own: torch.Tensor's default
                            ``__torch_function__`` runs the function, then converts every
                            torch.Tensor it returns to the subclass (torch._tensor._convert),
                            so ``x + 1``, ``torch.relu(x)``, ``x.sum()`` are KeepsType again.
  TaggedTensor(KeepsType)   the same, plus a ``tag`` attribute carried over to the results:
                            the default hook keeps the type, not your attributes.
  Wrapper                   not a tensor: holds one and forwards every torch function to it,
                            re-wrapping tensor results. It sees torch's *Python API* calls
                            (``torch.nn.functional.linear``, one call), where __torch_dispatch__
                            (dispatch_log.py) sees the ATen operators below them (t, addmm).

What changed: a new route, not a copy of an earlier stage (README).
Run it: ``pytest 15_tensor_subclasses/tests -k "subclass or plain or tagged or wrapper"``.
"""

from __future__ import annotations

import collections

import torch
from torch.utils._pytree import tree_map_only


class KeepsType(torch.Tensor):
    """A subclass that adds nothing: it relies on torch.Tensor's default __torch_function__."""


class TaggedTensor(KeepsType):
    """A KeepsType with a ``tag`` that every result inherits from the first tagged argument."""

    tag = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = super().__torch_function__(func, types, args, kwargs)  # runs func, converts to cls
        tags = [a.tag for a in (*args, *kwargs.values()) if isinstance(a, TaggedTensor) and a.tag is not None]
        if tags:
            def inherit(t):
                if t.tag is None:
                    t.tag = tags[0]
                return t
            tree_map_only(TaggedTensor, inherit, result)
        return result


def tagged(tensor: torch.Tensor, tag) -> TaggedTensor:
    """A TaggedTensor view of ``tensor`` (same memory, no copy)."""
    result = tensor.as_subclass(TaggedTensor)
    result.tag = tag
    return result


class Wrapper:
    """Holds a tensor; any torch function called on it runs on the tensor and returns a Wrapper.

    ``Wrapper.calls`` counts the torch functions seen, by name (torch.overrides.resolve_name);
    tensor methods (``w.dim()``) are forwarded as the torch functions ``torch.Tensor.<name>``.
    """

    calls = collections.Counter()

    def __init__(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"Wrapper: expected a torch.Tensor, got {type(tensor).__name__}")
        self.tensor = tensor

    def __repr__(self):
        return f"Wrapper({self.tensor!r})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if not all(issubclass(t, (torch.Tensor, Wrapper)) for t in types):
            return NotImplemented  # an unknown type: let it (or torch's TypeError) decide
        cls.calls[function_name(func)] += 1
        args, kwargs = tree_map_only(Wrapper, lambda w: w.tensor, (args, kwargs or {}))
        result = func(*args, **kwargs)
        return tree_map_only(torch.Tensor, Wrapper, result)

    def __getattr__(self, name):
        # What a tensor has and a Wrapper lacks (x.dim(), x.shape, x.t()): a method goes back
        # through __torch_function__ as torch.Tensor.<name> (counted, result re-wrapped); a plain
        # attribute (shape, dtype, device) is the wrapped tensor's.
        attribute = getattr(torch.Tensor, name)  # AttributeError for what tensors do not have
        if callable(attribute):
            return lambda *args, **kwargs: type(self).__torch_function__(attribute, (Wrapper,), (self, *args), kwargs)
        return getattr(self.tensor, name)

    def __add__(self, other):
        return torch.add(self, other)

    def __matmul__(self, other):
        return torch.matmul(self, other)


def function_name(func) -> str:
    """'torch.nn.functional.linear', 'torch.add', 'torch.Tensor.sum': torch's own name for it."""
    return torch.overrides.resolve_name(func) or repr(func)
