# Stage 14: autograd recipes in pure Python (MulConstant, Cube's double backward, conv+BN fusion).
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
from setuptools import setup

setup(
    name="eml-autograd-recipes",
    version="0.1.0",
    description="Stage 14: autograd.Function recipes: materialize_grads, double backward, a fused conv+BN that saves less",
    packages=["eml.autograd_recipes"],
    package_dir={"eml.autograd_recipes": "src"},  # the package's sources are in src/
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["14_autograd_recipes = eml.autograd_recipes:TOUR"]},
    python_requires=">=3.11",
)
