# Stage 16: stage 08's operators (torch.ops.eml_stable.*) on LibTorch's stable ABI and Python's
# limited API: one abi3 wheel for every CPython >= 3.10 and, as the stable ABI promises, for torch
# 2.13 and later (tested: 2.13.0 and 2.14.1; README).
# It is built against the installed torch's headers (torch/csrc/stable, torch/headeronly), but
# calls libtorch only through its C shim, so the wheel outlives that torch.
# Install:  pip install --no-build-isolation .    A wheel:  pip wheel --no-build-isolation --no-deps .
# (inside the tutorial's .venv: the build needs the installed torch, so no build isolation: an
# isolated build has no torch to import; with torch listed as a build requirement it would
# compile against a downloaded torch, not the installed one)
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
        f"linear_stable: LIBXSMM not found: no libxsmm.h in {LIBXSMM_INCLUDE_DIR} (set LIBXSMM_INCLUDE_DIR to look elsewhere).\n"
        "Install LIBXSMM 1.17, Debian's package libxsmm-dev:\n"
        "    sudo apt-get install -y libxsmm-dev\n"
        "or run `make` in the repository root, which installs it."
    )

# torch 2.13.0 as TORCH_ABI_VERSION encodes it (torch/headeronly/version.h): major << 56 | minor << 48.
TORCH_TARGET_VERSION = "0x020d000000000000"

setup(
    name="eml-linear-stable",
    version="0.1.0",
    description="Stage 16: the LIBXSMM linear layer as registered PyTorch operators on LibTorch's stable ABI",
    packages=["eml.linear_stable"],
    package_dir={"eml.linear_stable": "src"},  # the package's sources (Python and C++) are in src/
    # The compiled module eml.linear_stable._C. No -fopenmp: torch::stable::parallel_for runs in
    # libtorch (08's at::parallel_for was inline code compiled into _C, OpenMP pragmas and all).
    # No -march=native: LIBXSMM picks the instruction set when it generates a kernel, at run time.
    ext_modules=[
        CppExtension(
            "eml.linear_stable._C",
            ["src/FunctionCpp.cpp", "src/tools.cpp", "src/bindings.cpp"],  # and the headers they include, in src/
            include_dirs=[LIBXSMM_INCLUDE_DIR],
            library_dirs=[LIBXSMM_LIBRARY_DIR],
            # LIBXSMM's static libraries, in this order (libxsmm needs libxsmmnoblas's BLAS stubs).
            libraries=["xsmm", "xsmmnoblas", "pthread", "rt", "dl", "m"],
            # -fvisibility=hidden: _C exports only its init function. Stages 06, 07, 08 and 16 share
            # the C++ namespace tpp, and one process may load them all: their symbols stay their own.
            # New in 16: TORCH_TARGET_VERSION, the oldest torch the module must load in (2.13: its
            # set_python_module is 2.13's). The stable headers then offer only what that version
            # has, and libtorch's C++ headers (ATen, c10, torch/library.h) are an #error. So is
            # -DTORCH_STABLE_ONLY, which says the same outright.
            extra_compile_args=["-O3", "-fvisibility=hidden", f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}",
                                "-DTORCH_STABLE_ONLY"],
            # Keep LIBXSMM's symbols (and its BLAS stubs) inside _C instead of exporting them.
            extra_link_args=["-Wl,--exclude-libs,ALL"],
            # As in 08: compile with -DPy_LIMITED_API (CPython 3.10's stable ABI) and link no
            # libtorch_python: no pybind11, the module file is named _C.abi3.so.
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    # ... and tag the wheel abi3 for cp310 and later: *-cp310-abi3-linux_x86_64.whl.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["16_stable_abi = eml.linear_stable:TOUR"]},
    python_requires=">=3.10",
)
