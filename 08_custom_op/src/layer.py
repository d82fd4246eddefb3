"""Stage 08: the Layer on registered operators (ops.py registers them, bindings.cpp defines them).

What this stage teaches: the same layer as stage 06, on LIBXSMM's JIT kernels, but its forward
is one call of the PyTorch operator ``torch.ops.eml.linear`` instead of an autograd.Function
around pybind11 functions. The dispatcher knows the op's schema, its fake kernel, its autograd,
autocast and vmap rules (ops.py), so torch.compile compiles a model of these layers without a
graph break, torch.export exports it, torch.func.vmap and torch.autocast work, and the compiled
module, built on Python's limited API, serves every Python >= 3.10.

    torch.ops.eml.linear(input, weight, bias)    y = x W^T + b, bias may be None

What changed since stage 06: ``Function`` is gone (autograd is registered for the op), and so
is ``self.state``: a registered op cannot take a pybind11 object, so the kernels and plans live
in C++, in one process-wide state per (in_features, out_features), and the weight is packed on every call
(README, "State without pybind11", measures the choice). ``peak_gflops()`` calls an op too.
Run it: ``pip install --no-build-isolation .`` here (LIBXSMM needed: README), then ``pytest tests``.
"""

import math

import torch

from .ops import ops  # torch.ops.eml, with its Python registrations made


class Layer(torch.nn.Module):
    """y = x W^T + b for an input of shape (*, in_features): a drop-in for torch.nn.Linear.

    No state of its own: parameters only, so deepcopy, torch.save, functional_call and
    torch.func.stack_module_state treat it as they treat nn.Linear.
    """

    def __init__(self, in_features: int = None, out_features: int = None, bias: bool = True, device=None, dtype=None,
                 *, i_n_features_input: int = None, i_n_features_output: int = None):
        super().__init__()
        # nn.Linear's argument names, or the course's (i_n_features_input, i_n_features_output).
        in_features = in_features if i_n_features_input is None else i_n_features_input
        out_features = out_features if i_n_features_output is None else i_n_features_output
        if in_features is None or out_features is None:
            raise TypeError(f"Layer() needs in_features and out_features, got {in_features} and {out_features}")
        self.in_features = in_features
        self.out_features = out_features
        factory = {"device": device, "dtype": dtype}  # as nn.Linear: where and in which dtype the parameters live
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)  # keeps `layer.bias` defined (as None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The same initialisation as torch.nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) for both.
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # One operator call: what torch.compile, torch.export, vmap and autocast see. `.default`
        # names the overload directly (ops.linear would pick it at every call: a few us).
        return ops.linear.default(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def peak_gflops(repeats: int = 3, seconds: float = 0.1) -> float:
    """The machine's practical float32 peak in GFLOP/s, on torch.get_num_threads() threads.

    Every thread runs LIBXSMM's 64 x 64 x 64 kernel over and over on its own 48 KB of buffers
    (A in L1, B and C in L1/L2; no loop nest, no traffic beyond the core's caches): a practical
    peak, which deeper kernels can match or pass slightly. Best of ``repeats`` probes
    of ``seconds`` each, since a probe that overlapped other work reads low, never high.
    """
    ops.tpp_peak_gflops(seconds=0.01)  # warm-up: generate the kernel, wake the cores
    return max(ops.tpp_peak_gflops(64, 64, 64, seconds) for _ in range(repeats))
