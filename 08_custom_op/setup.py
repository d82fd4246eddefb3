# Stage 08: stage 06's C++ registered as PyTorch operators (torch.ops.eml.*), built on Python's
# limited API: one abi3 wheel for every CPython >= 3.10 (with this torch).
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
        f"linear_op: LIBXSMM not found: no libxsmm.h in {LIBXSMM_INCLUDE_DIR} (set LIBXSMM_INCLUDE_DIR to look elsewhere).\n"
        "Install LIBXSMM 1.17, Debian's package libxsmm-dev:\n"
        "    sudo apt-get install -y libxsmm-dev\n"
        "or run `make` in the repository root, which installs it."
    )

setup(
    name="eml-linear-op",
    version="0.1.0",
    description="Stage 08: the LIBXSMM linear layer as registered PyTorch operators (compile, export, vmap, autocast)",
    packages=["eml.linear_op"],
    package_dir={"eml.linear_op": "src"},  # the package's sources (Python and C++) are in src/
    # The compiled module eml.linear_op._C. -fopenmp turns on at::parallel_for's threads;
    # it is a compile flag only, so _C uses the OpenMP runtime torch loaded (06's README: one libgomp).
    # No -march=native: LIBXSMM picks the instruction set when it generates a kernel, at run time.
    ext_modules=[
        CppExtension(
            "eml.linear_op._C",
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
            # New in 08: compile with -DPy_LIMITED_API (CPython 3.10's stable ABI) and link no
            # libtorch_python: no pybind11, the module file is named _C.abi3.so.
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    # ... and tag the wheel abi3 for cp310 and later: *-cp310-abi3-linux_x86_64.whl.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["08_custom_op = eml.linear_op:TOUR"]},
    python_requires=">=3.10",
)
