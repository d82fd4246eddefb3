# Stage 04: forward and backward in C++ (FunctionCpp.cpp), the matrix products by ATen.
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
# (inside the tutorial's .venv: the build needs the installed torch, so no build isolation)
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="eml-linear-cpp",
    version="0.1.0",
    description="Stage 04: a linear layer whose forward and backward are C++ calling ATen",
    packages=["eml.linear_cpp"],
    package_dir={"eml.linear_cpp": "src"},  # the package's sources (Python and C++) are in src/
    # The compiled module eml.linear_cpp._C. No -fopenmp: ATen's own mm does the threading.
    ext_modules=[CppExtension("eml.linear_cpp._C", ["src/FunctionCpp.cpp"], extra_compile_args=["-O3"])],
    cmdclass={"build_ext": BuildExtension},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["04_cpp_aten = eml.linear_cpp:TOUR"]},
    python_requires=">=3.11",
)
