"""Stage 17's second build route: compile lltm.cpp just in time with torch.utils.cpp_extension.load().

``build()`` compiles the same source that setup.py builds ahead of time into
``$TORCH_EXTENSIONS_DIR/lltm_xsmm_jit`` (default ``~/.cache/torch_extensions/...``) and imports
it; a second call with an unchanged source only loads the cached build. LIBXSMM is linked as
setup.py links it (the same directories, overridable with LIBXSMM_INCLUDE_DIR/LIBXSMM_LIBRARY_DIR).
"""

import os

from torch.utils.cpp_extension import load

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lltm.cpp")
LIBXSMM_INCLUDE_DIR = os.environ.get("LIBXSMM_INCLUDE_DIR", "/usr/include")
LIBXSMM_LIBRARY_DIR = os.environ.get("LIBXSMM_LIBRARY_DIR", "/usr/lib")
LIBXSMM_LIBRARIES = ["xsmm", "xsmmnoblas", "pthread", "rt", "dl", "m"]


def build(verbose=False):
    """Compile (or reuse) the JIT build of lltm.cpp and return the imported module."""
    return load(name="lltm_xsmm_jit", sources=[SOURCE], verbose=verbose,
                extra_cflags=["-O3", "-fopenmp", "-fno-trapping-math", "-fvisibility=hidden"],
                extra_include_paths=[LIBXSMM_INCLUDE_DIR],
                extra_ldflags=[f"-L{LIBXSMM_LIBRARY_DIR}", *(f"-l{name}" for name in LIBXSMM_LIBRARIES),
                               "-Wl,--exclude-libs,ALL"])
