# Stage 11: the LLTM cell with one fused C++ pass each way (src/lltm.cpp), at::parallel_for over rows.
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
# (inside the tutorial's .venv: the build needs the installed torch, so no build isolation)
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="eml-lltm-fused",
    version="0.1.0",
    description="Stage 11: the LLTM cell, its element-wise work fused into one C++ pass each way",
    packages=["eml.lltm_fused"],
    package_dir={"eml.lltm_fused": "src"},  # the package's sources (Python and C++) are in src/
    package_data={"eml.lltm_fused": ["lltm.cpp"]},  # shipped for the JIT route (jit.py)
    # The compiled module eml.lltm_fused._C. -fopenmp on the compile line only: at::parallel_for
    # then runs on torch's own OpenMP runtime (the one libgomp torch loads; no second one).
    # -fno-trapping-math lets gcc vectorise the clamps and selects of the fused loops (lltm.cpp, 2.).
    ext_modules=[CppExtension("eml.lltm_fused._C", ["src/lltm.cpp"], extra_compile_args=["-O3", "-fopenmp", "-fno-trapping-math"])],
    cmdclass={"build_ext": BuildExtension},
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["11_lltm_fused = eml.lltm_fused:TOUR"]},
    python_requires=">=3.11",
)
