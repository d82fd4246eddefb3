# Stage 05: forward and backward in C++ (FunctionCpp.cpp), the matrix products by our own loops.
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
# (inside the tutorial's .venv: the build needs the installed torch, so no build isolation)
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="eml-linear-cpp-naive",
    version="0.1.0",
    description="Stage 05: a linear layer whose forward and backward are C++ loops",
    packages=["eml.linear_cpp_naive"],
    package_dir={"eml.linear_cpp_naive": "src"},  # the package's sources (Python and C++) are in src/
    # The compiled module eml.linear_cpp_naive._C. -fopenmp turns on at::parallel_for's threads;
    # it is a compile flag only, so _C uses the OpenMP runtime torch loaded (README: one libgomp).
    ext_modules=[CppExtension("eml.linear_cpp_naive._C", ["src/FunctionCpp.cpp"], extra_compile_args=["-O3", "-fopenmp"])],
    cmdclass={"build_ext": BuildExtension},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["05_cpp_naive = eml.linear_cpp_naive:TOUR"]},
    python_requires=">=3.11",
)
