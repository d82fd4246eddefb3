# Stage 09: the LLTM cell in Python: an nn.Module (autograd) and an autograd.Function (by hand).
# Install:  pip install --no-build-isolation .    or the course's route:  python setup.py install
from setuptools import setup

setup(
    name="eml-lltm-python",
    version="0.1.0",
    description="Stage 09: the LLTM cell in Python, its backward by autograd and by hand",
    packages=["eml.lltm_python"],
    package_dir={"eml.lltm_python": "src"},  # the package's sources are in src/
    # Joins the tour (python -m eml.common.tour) without any edit to the tour's code.
    entry_points={"eml.tour": ["09_lltm_python = eml.lltm_python:TOUR"]},
    python_requires=">=3.11",
)
