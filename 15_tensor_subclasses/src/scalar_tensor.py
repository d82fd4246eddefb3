"""Stage 15: ScalarTensor, a type that is not a torch.Tensor but that torch functions accept.

What this stage teaches: ``__torch_function__``, the hook torch's Python API checks on every
argument: ``torch.mean(s)`` with a ScalarTensor ``s`` calls ``ScalarTensor.__torch_function__
(torch.mean, types, args, kwargs)`` instead of torch's own code. The example is the one of
PyTorch's "Extending PyTorch" notes (an N x N diagonal matrix ``value * I`` stored as two
numbers). Kept as the notes have it: ``implements`` calls ``functools.update_wrapper(func,
torch_function)`` on the registered implementation and returns the same function object, and
``__torch_function__`` returns ``NotImplemented`` for a function it does not handle and for an
argument type it does not know, so that torch can try the other types' overrides and then
raise a clear TypeError. Changed, in three places the notes leave as they are:

  - ``torch.mean`` returns a tensor as torch.mean does (the notes' mean returns a Python float)
    and honours ``dim``, ``keepdim`` and ``dtype``;
  - ``torch.add`` decides with ``isinstance`` whether both arguments are ScalarTensors (the
    notes' add catches every AttributeError for that, so an AttributeError from a bug inside
    its fast path silently sends it down the dense path);
  - ``torch.add`` takes each parameter torch's own signature has (the notes' add(input, other)
    takes neither ``alpha`` nor ``out``): ``alpha`` is honoured, ``out`` refused clearly, and
    coverage.py checks every implementation against ``torch.overrides.get_testing_overrides()``.

What changed: a new route, not a copy of an earlier stage (README).
Run it: ``python -c "import torch; from eml.tensor_subclasses import ScalarTensor; print(torch.mean(ScalarTensor(5, 2.0)))"``.
"""

from __future__ import annotations

import functools

import torch

# torch function -> ScalarTensor's implementation of it
HANDLED_FUNCTIONS = {}


def implements(torch_function):
    """Register the decorated function as ScalarTensor's implementation of ``torch_function``."""

    def decorator(func):
        # func takes torch_function's __name__, __qualname__, __doc__ and __module__, and __wrapped__
        # points to it: help() and repr() of an override then name the torch function it stands
        # for (a traceback still shows the def's own name: it comes from the code object).
        functools.update_wrapper(func, torch_function)
        HANDLED_FUNCTIONS[torch_function] = func
        return func  # the module-level name stays our implementation, callable directly

    return decorator


class ScalarTensor:
    """The N x N matrix ``value * I``, stored as N and value.

    Not a torch.Tensor subclass: torch functions accept it only through ``__torch_function__``,
    and only those in HANDLED_FUNCTIONS; any other raises TypeError.
    """

    def __init__(self, N: int, value: float):
        if not isinstance(N, int) or N < 0:
            raise ValueError(f"ScalarTensor: N must be an int >= 0, got {N!r}")
        self._N = N
        self._value = value

    def __repr__(self):
        return f"ScalarTensor(N={self._N}, value={self._value})"

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self._N, self._N))

    def tensor(self) -> torch.Tensor:
        """The dense N x N matrix it stands for."""
        return self._value * torch.eye(self._N)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        # `types` holds the type of every argument that has a __torch_function__. Refuse to act
        # for a type we do not know: returning NotImplemented lets torch ask that type instead.
        if func not in HANDLED_FUNCTIONS or not all(issubclass(t, (torch.Tensor, ScalarTensor)) for t in types):
            return NotImplemented
        return HANDLED_FUNCTIONS[func](*args, **kwargs)

    # Python's operators are not torch functions: route them to the ones we implement.
    def __add__(self, other):
        return torch.add(self, other)

    def __radd__(self, other):
        return torch.add(other, self)


def ensure_tensor(data) -> torch.Tensor:
    """A ScalarTensor as its dense matrix; anything else through torch.as_tensor."""
    if isinstance(data, ScalarTensor):
        return data.tensor()
    return torch.as_tensor(data)


@implements(torch.mean)
def mean(input, dim=None, keepdim=False, *, dtype=None):
    if dim is None and not keepdim and input._N > 0:
        # value * I holds N entries equal to value among N*N: the mean is value / N, in O(1).
        # (computed in Python's double, then converted to the asked dtype: equal to torch's mean of
        # the dense matrix within rounding, tested with assert_close)
        return torch.tensor(input._value / input._N, dtype=dtype if dtype is not None else torch.get_default_dtype())
    # Any other case (a dim, keepdim, N == 0): on the dense matrix, correct by construction.
    return torch.mean(input.tensor(), dim=dim, keepdim=keepdim, dtype=dtype)


@implements(torch.add)
def add(input, other, *, alpha=1, out=None):
    if out is not None:
        raise TypeError("ScalarTensor: torch.add(..., out=...) is not supported (a ScalarTensor owns no memory to write)")
    if isinstance(input, ScalarTensor) and isinstance(other, ScalarTensor):
        if input._N != other._N:
            raise ValueError(f"ScalarTensor: cannot add sizes N={input._N} and N={other._N}")
        return ScalarTensor(input._N, input._value + alpha * other._value)
    # One side is a plain tensor (or a number): compute on the dense matrix.
    return torch.add(ensure_tensor(input), ensure_tensor(other), alpha=alpha)
