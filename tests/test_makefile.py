"""The compiler flags `make` exports for every build: Python's own, then -g0.

setuptools takes CFLAGS from the environment in place of Python's flags (sysconfig's CFLAGS:
-DNDEBUG -g -fwrapv -O3 -Wall ...), so a Makefile exporting CFLAGS=-g0 alone would drop -DNDEBUG,
and torch's debug-only checks would come back into every stage's module (stage 08's imports one
more libtorch symbol: notebook 16 counts them). Read in an environment without CFLAGS, as on a
fresh machine."""

import os
import pathlib
import shutil
import subprocess
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def exported_cflags(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("CFLAGS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(["make", "--no-print-directory", "--eval", 'print-cflags: ; @echo "$$CFLAGS"', "print-cflags"],
                            cwd=ROOT, env=dict(env, **extra), capture_output=True, text=True, check=True)
    return result.stdout.strip()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_exports_pythons_flags_then_g0():
    flags = exported_cflags()
    assert flags == f"{sysconfig.get_config_var('CFLAGS')} -g0", flags
    assert "-DNDEBUG" in flags.split() and flags.split()[-1] == "-g0"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_cflags_of_ones_own_replace_the_makefiles():
    assert exported_cflags(CFLAGS="-O1 -g") == "-O1 -g"
