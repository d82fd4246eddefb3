# Stage 10: the LLTM cell's forward and backward in C++ on ATen (src/lltm.cpp), bound with pybind11.
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
# (inside the tutorial's .venv: the build needs the installed torch, so no build isolation)
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="eml-lltm-cpp",
    version="0.1.0",
    description="Stage 10: the LLTM cell in C++ on ATen",
    packages=["eml.lltm_cpp"],
    package_dir={"eml.lltm_cpp": "src"},  # the package's sources (Python and C++) are in src/
    package_data={"eml.lltm_cpp": ["lltm.cpp"]},  # shipped for the JIT route (jit.py)
    # The compiled module eml.lltm_cpp._C. No -fopenmp: every loop is inside ATen's own ops.
    ext_modules=[CppExtension("eml.lltm_cpp._C", ["src/lltm.cpp"], extra_compile_args=["-O3"])],
    cmdclass={"build_ext": BuildExtension},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["10_lltm_cpp = eml.lltm_cpp:TOUR"]},
    python_requires=">=3.11",
)
