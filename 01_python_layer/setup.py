# Stage 01: a linear layer as a plain torch.nn.Module (pure Python, nothing to compile).
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
from setuptools import setup

setup(
    name="eml-ext-linear-python",
    version="0.1.0",
    description="Stage 01: a linear layer as a torch.nn.Module",
    packages=["eml.ext.linear_python"],
    package_dir={"eml.ext.linear_python": "src"},  # the package's sources are in src/
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["01_python_layer = eml.ext.linear_python:TOUR"]},
    python_requires=">=3.11",
)
