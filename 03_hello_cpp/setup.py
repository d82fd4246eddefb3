# Stage 03: a C++ hello() bound with pybind11, built ahead of time by setuptools.
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
# (inside the tutorial's .venv: the build needs the installed torch, so no build isolation)
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="eml-hello-cpp",
    version="0.1.0",
    description="Stage 03: hello() from C++",
    packages=["eml.hello_cpp"],
    package_dir={"eml.hello_cpp": "src"},  # the package's sources are in src/
    package_data={"eml.hello_cpp": ["hello.cpp"]},  # shipped for the JIT route (jit.py)
    ext_modules=[CppExtension("eml.hello_cpp._C", ["src/hello.cpp"], extra_compile_args=["-O3"])],
    cmdclass={"build_ext": BuildExtension},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["03_hello_cpp = eml.hello_cpp:TOUR"]},
    python_requires=">=3.11",
)
