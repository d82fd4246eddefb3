"""Stage 11's second build route: compile lltm.cpp just in time with torch.utils.cpp_extension.load().

``build()`` compiles the same source that setup.py builds ahead of time into
``$TORCH_EXTENSIONS_DIR/lltm_fused_jit`` (default ``~/.cache/torch_extensions/...``) and imports
it; a second call with an unchanged source only loads the cached build.
"""

import os

from torch.utils.cpp_extension import load

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lltm.cpp")


def build(verbose=False):
    """Compile (or reuse) the JIT build of lltm.cpp and return the imported module."""
    return load(name="lltm_fused_jit", sources=[SOURCE], extra_cflags=["-O3", "-fopenmp", "-fno-trapping-math"], verbose=verbose)
