"""Stage 12's second build route: compile lltm_cuda.cpp and lltm_cuda_kernel.cu just in time.

``build()`` compiles the same two sources that setup.py builds ahead of time, the .cpp with the
host compiler and the .cu with nvcc, into ``$TORCH_EXTENSIONS_DIR/lltm_cuda_jit`` (default
``~/.cache/torch_extensions/...``), and imports the module. A second call with unchanged
sources only loads the cached build. Without a CUDA build of torch it raises at once, with the
reason, instead of starting a compiler that cannot succeed.
"""

import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, "lltm_cuda.cpp"), os.path.join(HERE, "lltm_cuda_kernel.cu")]


def build(verbose=False):
    """Compile (or reuse) the JIT build of stage 12 and return the imported module."""
    if torch.version.cuda is None:
        raise RuntimeError(
            f"eml.lltm_cuda needs CUDA: torch {torch.__version__} is a CPU-only build "
            "(torch.version.cuda is None), so its kernels cannot be compiled here"
        )
    from torch.utils.cpp_extension import load  # imported here: only the CUDA route needs it

    return load(
        name="lltm_cuda_jit",
        sources=SOURCES,
        extra_cflags=["-O3"],  # JIT builds add no optimisation flag by themselves
        extra_cuda_cflags=["-O3"],
        verbose=verbose,
    )
