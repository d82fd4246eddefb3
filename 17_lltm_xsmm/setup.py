# Stage 17: the LLTM cell with one fused C++ pass each way (stage 11) and its GEMMs on LIBXSMM's
# JIT kernels (src/lltm.cpp, section 3c).
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
        f"lltm_xsmm: LIBXSMM not found: no libxsmm.h in {LIBXSMM_INCLUDE_DIR} (set LIBXSMM_INCLUDE_DIR to look elsewhere).\n"
        "Install LIBXSMM 1.17, Debian's package libxsmm-dev:\n"
        "    sudo apt-get install -y libxsmm-dev\n"
        "or run `make` in the repository root, which installs it."
    )

# LIBXSMM's static libraries, in this order (libxsmm needs libxsmmnoblas's BLAS stubs); the
# JIT route (src/jit.py) links the same.
LIBXSMM_LIBRARIES = ["xsmm", "xsmmnoblas", "pthread", "rt", "dl", "m"]

setup(
    name="eml-lltm-xsmm",
    version="0.1.0",
    description="Stage 17: the fused LLTM cell with its GEMMs on LIBXSMM's JIT kernels",
    packages=["eml.lltm_xsmm"],
    package_dir={"eml.lltm_xsmm": "src"},  # the package's sources (Python and C++) are in src/
    package_data={"eml.lltm_xsmm": ["lltm.cpp"]},  # shipped for the JIT route (jit.py)
    # The compiled module eml.lltm_xsmm._C. -fopenmp on the compile line only: at::parallel_for
    # then runs on torch's own OpenMP runtime (the one libgomp torch loads; no second one).
    # -fno-trapping-math lets gcc vectorise the clamps and selects of the fused loops (lltm.cpp, 2.).
    # -fvisibility=hidden and --exclude-libs: LIBXSMM's symbols stay inside _C, as in stage 06.
    ext_modules=[
        CppExtension(
            "eml.lltm_xsmm._C",
            ["src/lltm.cpp"],
            include_dirs=[LIBXSMM_INCLUDE_DIR],
            library_dirs=[LIBXSMM_LIBRARY_DIR],
            libraries=LIBXSMM_LIBRARIES,
            extra_compile_args=["-O3", "-fopenmp", "-fno-trapping-math", "-fvisibility=hidden"],
            extra_link_args=["-Wl,--exclude-libs,ALL"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["17_lltm_xsmm = eml.lltm_xsmm:TOUR"]},
    python_requires=">=3.11",
)
