# Stage 13: a plain C library (src/eml_add.c, no PyTorch in it) called from Python with ctypes.
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
# Either route compiles src/eml_add.c into eml/c_ffi/libeml_add.so, next to the Python files.
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class build_c_library(build_ext):
    """Builds the C sources as a plain shared library, not as a Python extension module.

    The .so is named libeml_add.so (no cpython-311-... suffix) and is loaded by ctypes by its path
    (src/clib.py), never through `import`. It has no PyInit_ function because eml_add.c defines
    none; the empty export list only matters to MSVC, which would otherwise ask for PyInit_.
    """

    def get_ext_filename(self, fullname):
        return fullname.replace(".", "/") + ".so"  # eml.c_ffi.libeml_add -> eml/c_ffi/libeml_add.so

    def get_export_symbols(self, ext):
        # MSVC only (the Unix compiler class never passes the list on): no PyInit_libeml_add, this
        # is not a Python module
        return []


setup(
    name="eml-c-ffi",
    version="0.1.0",
    description="Stage 13: a plain C library called from PyTorch through ctypes",
    packages=["eml.c_ffi"],
    package_dir={"eml.c_ffi": "src"},  # the package's sources (Python and C) are in src/
    ext_modules=[
        Extension(
            "eml.c_ffi.libeml_add",
            ["src/eml_add.c"],  # and its header src/eml_add.h
            extra_compile_args=["-O2", "-std=c99"],
        )
    ],
    cmdclass={"build_ext": build_c_library},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["13_c_ffi = eml.c_ffi:TOUR"]},
    python_requires=">=3.11",
)
