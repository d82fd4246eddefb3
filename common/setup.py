# common/: the code every stage shares, installed once as `eml.common`.
#   eml.common.checks  - the reference checks, gradcheck helpers and bad-input checks that
#                        every stage's tests inherit (LayerTests, FunctionTests)
#   eml.common.timing  - side-by-side timing on torch.utils.benchmark (tour and notebooks)
#   eml.common.tour    - `python -m eml.common.tour`: every installed stage, checked and timed
# Install: pip install --no-build-isolation ./common   (or: cd common && python setup.py install)
from setuptools import setup

setup(
    name="eml-common",
    version="0.1.0",
    description="Shared checks, timing and the tour of the 'From PyTorch to Machine Code' tutorial",
    packages=["eml.common"],
    python_requires=">=3.11",
)
