"""Stage 03 of "From PyTorch to Machine Code": hello() from C++, bound with pybind11.

``hello`` comes from the ahead-of-time build (setup.py); ``jit.build()`` gives the same
function through the just-in-time route.
"""

# Import torch first: CppExtension links the module against libc10/libtorch, and importing
# torch is what loads those libraries into the process (else: "libc10.so: cannot open ...").
import torch  # noqa: F401

from ._C import hello

__all__ = ["hello"]

# How this stage joins the tour (`python -m eml.common.tour`): setup.py names this dict as an
# entry point in the group "eml.tour". This stage has no layer, only a demo to run.
TOUR = {"demo": hello}
