# Stage 15: extending torch itself: __torch_function__ (ScalarTensor, subclasses, a wrapper, the
# override-coverage API) and __torch_dispatch__ (the ATen operators a model runs). Pure Python.
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
from setuptools import setup

setup(
    name="eml-tensor-subclasses",
    version="0.1.0",
    description="Stage 15: __torch_function__ and __torch_dispatch__ on the tutorial's own layers",
    packages=["eml.tensor_subclasses"],
    package_dir={"eml.tensor_subclasses": "src"},  # the package's sources are in src/
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["15_tensor_subclasses = eml.tensor_subclasses:TOUR"]},
    python_requires=">=3.11",
)
