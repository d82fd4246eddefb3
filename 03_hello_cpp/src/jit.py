"""Stage 03's second route: compile hello.cpp just in time with torch.utils.cpp_extension.load.

``build()`` compiles the same hello.cpp that setup.py builds ahead of time, into
``$TORCH_EXTENSIONS_DIR/hello_cpp_jit`` (default ``~/.cache/torch_extensions/...``), and
imports it. A second call with an unchanged source only loads the cached build.
"""

import os

from torch.utils.cpp_extension import load

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hello.cpp")


def build(verbose=False):
    """Compile (or reuse) the JIT build of hello.cpp and return the imported module."""
    return load(
        name="hello_cpp_jit",
        sources=[SOURCE],
        extra_cflags=["-O3"],  # JIT builds add no optimisation flag by themselves
        verbose=verbose,
    )
