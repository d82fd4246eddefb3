# Stage 12: the LLTM cell on a GPU, two fused CUDA kernels (src/lltm_cuda_kernel.cu) beside
# cuBLAS GEMMs (src/lltm_cuda.cpp). Needs a CUDA build of torch, nvcc, and a GPU (or
# TORCH_CUDA_ARCH_LIST naming the GPUs to build for).
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
# Without CUDA (torch's CPU build, this tutorial's default) it stops with one line saying why.
import os
import sys

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension


def why_not_buildable():
    """None when a CUDA extension can be built here, else the one-line reason."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    if CUDA_HOME is None:
        return f"no CUDA toolkit (nvcc) found for torch {torch.__version__}; set CUDA_HOME"
    if not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return "no GPU visible; set TORCH_CUDA_ARCH_LIST (e.g. '9.0' for an H100) to build for one anyway"
    return None


reason = why_not_buildable()
if reason is not None:
    sys.exit(f"12_lltm_cuda: cannot build stage 12 (CUDA kernels): {reason}")

setup(
    name="eml-lltm-cuda",
    version="0.1.0",
    description="Stage 12: the LLTM cell with fused CUDA kernels for its element-wise work",
    packages=["eml.lltm_cuda"],
    package_dir={"eml.lltm_cuda": "src"},  # the package's sources (Python, C++, CUDA) are in src/
    package_data={"eml.lltm_cuda": ["lltm_cuda.cpp", "lltm_cuda_kernel.cu"]},  # for the JIT route (jit.py)
    # The compiled module eml.lltm_cuda._C: lltm_cuda.cpp by the host compiler, the .cu by nvcc.
    ext_modules=[
        CUDAExtension(
            "eml.lltm_cuda._C",
            ["src/lltm_cuda.cpp", "src/lltm_cuda_kernel.cu"],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    # Joins the tour (python -m eml.common.tour) where it is installed, i.e. on a GPU machine.
    entry_points={"eml.tour": ["12_lltm_cuda = eml.lltm_cuda:TOUR"]},
    python_requires=">=3.11",
)
