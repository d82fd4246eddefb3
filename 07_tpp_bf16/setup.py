# Stage 07: forward and backward in C++ (src/FunctionCpp.cpp and its headers) in float32, float64 and bfloat16, on LIBXSMM's JIT kernels.
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
# (inside the tutorial's .venv: the build needs the installed torch, so no build isolation)
# Needs LIBXSMM 1.17 (Debian/Ubuntu: sudo apt-get install -y libxsmm-dev; `make` at the root does it).
import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

# Where LIBXSMM lives: Debian's libxsmm-dev puts the headers in /usr/include and the static
# libraries in /usr/lib. Point these at another installation (e.g. a LIBXSMM 1.17 built from source).
LIBXSMM_INCLUDE_DIR = os.environ.get("LIBXSMM_INCLUDE_DIR", "/usr/include")
LIBXSMM_LIBRARY_DIR = os.environ.get("LIBXSMM_LIBRARY_DIR", "/usr/lib")
if not os.path.isfile(os.path.join(LIBXSMM_INCLUDE_DIR, "libxsmm.h")):
    # Say so before the compiler does, and name the fix.
    sys.exit(
        f"linear_tpp_bf16: LIBXSMM not found: no libxsmm.h in {LIBXSMM_INCLUDE_DIR} (set LIBXSMM_INCLUDE_DIR to look elsewhere).\n"
        "Install LIBXSMM 1.17, Debian's package libxsmm-dev:\n"
        "    sudo apt-get install -y libxsmm-dev\n"
        "or run `make` in the repository root, which installs it."
    )

setup(
    name="eml-linear-tpp-bf16",
    version="0.1.0",
    description="Stage 07: a linear layer in bfloat16 on LIBXSMM's VNNI kernels (fp32 fallback), float32 and float64 as stage 06",
    packages=["eml.linear_tpp_bf16"],
    package_dir={"eml.linear_tpp_bf16": "src"},  # the package's sources (Python and C++) are in src/
    # The compiled module eml.linear_tpp_bf16._C. -fopenmp turns on at::parallel_for's threads;
    # it is a compile flag only, so _C uses the OpenMP runtime torch loaded (06's README: one libgomp).
    # No -march=native: LIBXSMM picks the instruction set when it generates a kernel, at run time.
    ext_modules=[
        CppExtension(
            "eml.linear_tpp_bf16._C",
            ["src/FunctionCpp.cpp", "src/tools.cpp", "src/bindings.cpp"],  # and the headers they include, in src/
            include_dirs=[LIBXSMM_INCLUDE_DIR],
            library_dirs=[LIBXSMM_LIBRARY_DIR],
            # LIBXSMM's static libraries, in this order (libxsmm needs libxsmmnoblas's BLAS stubs).
            libraries=["xsmm", "xsmmnoblas", "pthread", "rt", "dl", "m"],
            # -fvisibility=hidden: of _C's own functions only its init function is exported (the inline
            # functions of torch's headers stay visible, as weak symbols). Stages 06, 07 and 08 share
            # the C++ namespace tpp, and one process may load all three: their symbols stay their own.
            extra_compile_args=["-O3", "-fopenmp", "-fvisibility=hidden"],
            # Keep LIBXSMM's symbols (and its BLAS stubs) inside _C instead of exporting them.
            extra_link_args=["-Wl,--exclude-libs,ALL"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["07_tpp_bf16 = eml.linear_tpp_bf16:TOUR"]},
    python_requires=">=3.11",
)
