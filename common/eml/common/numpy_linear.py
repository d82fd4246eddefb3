"""A second float32 baseline for the tour: the linear layer on numpy's BLAS (OpenBLAS).

torch's float32 GEMM on the AMD EPYC CPUs measured (Zen 3, 4, 5) is MKL on its generic code path (``MKL_VERBOSE=1``
prints "Intel(R) Architecture processors": no AVX-512 kernels), so beating ``torch.nn.Linear``
alone says little about a kernel. numpy's wheels ship OpenBLAS, which picks its kernels for
the CPU at run time (``numpy.show_config()``): a strong float32 BLAS that every numpy user
already has. This layer runs all three products through numpy on the tensors' own
memory (``Tensor.numpy()`` is a view, no copy), so the tour can put each stage beside both.

OpenBLAS runs its own thread pool (``OPENBLAS_NUM_THREADS``, default: every core), not
torch's; the tour runs with as many torch threads as cores, so both use the same cores.
"""

from __future__ import annotations

import math

import numpy as np
import torch

LABEL = "numpy (OpenBLAS)"


def _as_2d(tensor: torch.Tensor) -> np.ndarray:
    """(*, features) -> a contiguous (N, features) numpy view (a copy only if not contiguous)."""
    return tensor.detach().reshape(-1, tensor.shape[-1]).contiguous().numpy()


class NumpyFunction(torch.autograd.Function):
    """y = x W^T + b, and its three gradients, on numpy's matmul (BLAS sgemm/dgemm)."""

    @staticmethod
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight)
        x, w = _as_2d(input), weight.detach().numpy()
        y = x @ w.T
        if bias is not None:
            y += bias.detach().numpy()
        return torch.from_numpy(y).reshape(*input.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        gy, x, w = _as_2d(grad_output), _as_2d(input), weight.detach().numpy()
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = torch.from_numpy(gy @ w).reshape(input.shape)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.from_numpy(gy.T @ x)
        if ctx.needs_input_grad[2]:
            grad_bias = torch.from_numpy(gy.sum(axis=0))
        return grad_input, grad_weight, grad_bias


class NumpyLinear(torch.nn.Module):
    """A torch.nn.Linear whose products run on numpy's BLAS: a timing baseline, CPU only."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features))
        self.bias = torch.nn.Parameter(torch.empty(out_features)) if bias else None
        bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return NumpyFunction.apply(input, self.weight, self.bias)


def blas_name() -> str:
    """numpy's BLAS as numpy reports it, e.g. 'scipy-openblas 0.3.31.188.0'."""
    try:
        config = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{config.get('name', '?')} {config.get('version', '')}".strip()
        return name
    except Exception:  # an older numpy, or one built without the dict report
        return "numpy's BLAS"
