"""Stage 13: the C library libeml_add.so, loaded with ctypes, and the checks that guard it.

What this stage teaches: how to call a plain C library on a tensor's memory with no copy:
load the .so by its path (ctypes.CDLL), declare each function's argument and result types,
check every tensor in Python, then pass ``tensor.data_ptr()`` as the C pointer. C trusts the
pointer blindly: a wrong shape, dtype, stride or device is a wrong answer or a crash there,
so every check happens here, BEFORE any pointer is passed (tests/test_stage.py proves that a
rejected input never reaches C, with the library's own call counter).
What changed: a new route (README: what torch.utils.ffi was and why it went).
Run it: ``pip install --no-build-isolation .`` in 13_c_ffi, then
``python -c "import torch; from eml.c_ffi import clib; print(clib.add_forward(torch.ones(3), torch.ones(3)))"``.

The functions here are the raw layer: tensors in, new tensors out, no autograd. They accept
only what C can read directly (contiguous CPU float32/float64); layer.py makes inputs
contiguous and adds autograd, ops.py registers them as torch.library operators.
"""

from __future__ import annotations

import ctypes
import pathlib

import torch

# ---- 1. Load the library by path ---------------------------------------------------------
# setup.py installs libeml_add.so next to this file: found by path, never via LD_LIBRARY_PATH.
LIBRARY_PATH = pathlib.Path(__file__).resolve().with_name("libeml_add.so")
ABI_VERSION = 1  # must equal EML_ADD_ABI_VERSION in eml_add.h


def _load(path: pathlib.Path) -> ctypes.CDLL:
    if not path.is_file():
        raise ImportError(f"eml.c_ffi: the C library {path} is missing: reinstall 13_c_ffi "
                          "(pip install --no-build-isolation ./13_c_ffi)")
    lib = ctypes.CDLL(str(path))  # CDLL releases the GIL during every call
    # ---- 2. Declare every signature (ctypes would otherwise guess int for all of them) ----
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.eml_abi_version.argtypes, lib.eml_abi_version.restype = [], i64
    lib.eml_calls.argtypes, lib.eml_calls.restype = [], i64
    lib.eml_reset_calls.argtypes, lib.eml_reset_calls.restype = [], None
    for suffix in ("f32", "f64"):
        getattr(lib, f"eml_add_forward_{suffix}").argtypes = [ptr, ptr, ptr, i64]
        getattr(lib, f"eml_add_backward_{suffix}").argtypes = [ptr, ptr, ptr, i64]
        getattr(lib, f"eml_linear_forward_{suffix}").argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64]
        for name in ("add_forward", "add_backward", "linear_forward"):
            getattr(lib, f"eml_{name}_{suffix}").restype = None
    version = lib.eml_abi_version()
    if version != ABI_VERSION:
        raise ImportError(f"eml.c_ffi: {path} has ABI version {version}, this Python code expects {ABI_VERSION}: reinstall 13_c_ffi")
    return lib


LIB = _load(LIBRARY_PATH)
SUFFIX = {torch.float32: "f32", torch.float64: "f64"}  # the C types the library has entry points for


def calls() -> int:
    """How many computing C functions ran since load (or reset_calls)."""
    return LIB.eml_calls()


def reset_calls() -> None:
    LIB.eml_reset_calls()


# ---- 3. The checks: everything C cannot check for itself -----------------------------------
def check_tensor(name: str, tensor, dtype=None) -> None:
    """A tensor C can read as a dense array: CPU, float32/float64 (or ``dtype``), contiguous."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"c_ffi: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"c_ffi: {name} must be on the CPU (C reads host memory), got device {tensor.device}")
    if tensor.dtype not in SUFFIX:
        raise TypeError(f"c_ffi: {name} must have dtype torch.float32 or torch.float64, got dtype {tensor.dtype}")
    if dtype is not None and tensor.dtype != dtype:
        raise TypeError(f"c_ffi: {name} must have the same dtype as the first input, {dtype}, got dtype {tensor.dtype}")
    if not tensor.is_contiguous():
        raise ValueError(f"c_ffi: {name} must be contiguous (C reads a dense row-major array), "
                         f"got shape {list(tensor.shape)} with strides {list(tensor.stride())}: call .contiguous()")
    if type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
        # A tensor subclass may hold no memory of its own (a wrapper, a FakeTensor under torch.compile).
        raise TypeError(f"c_ffi: {name} must be a plain torch.Tensor, got the subclass {type(tensor).__name__}")


def _ptr(tensor: torch.Tensor) -> int:
    """The address of the first element: the tensor's own memory, no copy."""
    return tensor.data_ptr()


# ---- 4. The raw calls: check, allocate the outputs, pass pointers ---------------------------
def add_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b by eml_add_forward_*; a and b: same shape, dtype, contiguous CPU."""
    check_tensor("a", a)
    check_tensor("b", b, a.dtype)
    if a.shape != b.shape:
        raise ValueError(f"c_ffi.add: a and b must have the same shape, got {list(a.shape)} and {list(b.shape)}")
    out = torch.empty_like(a, memory_format=torch.contiguous_format)
    getattr(LIB, f"eml_add_forward_{SUFFIX[a.dtype]}")(_ptr(a), _ptr(b), _ptr(out), a.numel())
    return out


def add_backward(grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_a, grad_b) of a + b by eml_add_backward_*: both equal grad_out."""
    check_tensor("grad_out", grad_out)
    grad_a = torch.empty_like(grad_out, memory_format=torch.contiguous_format)
    grad_b = torch.empty_like(grad_out, memory_format=torch.contiguous_format)
    getattr(LIB, f"eml_add_backward_{SUFFIX[grad_out.dtype]}")(_ptr(grad_out), _ptr(grad_a), _ptr(grad_b), grad_out.numel())
    return grad_a, grad_b


def linear_forward(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b by eml_linear_forward_*; x: (rows, in), w: (out, in), bias: (out,) or None."""
    check_tensor("input", x)
    check_tensor("weight", w, x.dtype)
    if bias is not None:
        check_tensor("bias", bias, x.dtype)
    if x.dim() != 2:
        raise ValueError(f"c_ffi.linear: input must be 2-d (rows, in_features), got {x.dim()}-d shape {list(x.shape)}")
    if w.dim() != 2:
        raise ValueError(f"c_ffi.linear: weight must be 2-d (out_features, in_features), got {w.dim()}-d shape {list(w.shape)}")
    rows, in_features = x.shape
    out_features = w.shape[0]
    if w.shape[1] != in_features:
        raise ValueError(f"c_ffi.linear: input has {in_features} features, weight expects {w.shape[1]} in_features")
    if bias is not None and tuple(bias.shape) != (out_features,):
        raise ValueError(f"c_ffi.linear: bias must have shape [{out_features}] (out_features), got {list(bias.shape)}")
    y = torch.empty(rows, out_features, dtype=x.dtype)
    bias_ptr = None if bias is None else _ptr(bias)  # None is C's NULL
    getattr(LIB, f"eml_linear_forward_{SUFFIX[x.dtype]}")(_ptr(x), _ptr(w), bias_ptr, _ptr(y), rows, in_features, out_features)
    return y
