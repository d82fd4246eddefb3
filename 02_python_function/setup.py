# Stage 02: the forward in a torch.autograd.Function, the backward by hand (pure Python).
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
from setuptools import setup

setup(
    name="eml-ext-linear-python-function",
    version="0.1.0",
    description="Stage 02: a linear layer as a torch.autograd.Function with a hand-written backward",
    packages=["eml.ext.linear_python_function"],
    package_dir={"eml.ext.linear_python_function": "src"},  # the package's sources are in src/
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["02_python_function = eml.ext.linear_python_function:TOUR"]},
    python_requires=">=3.11",
)
