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


def make_venv(tmp_path, fake_python_body):
    """`make` of the venv step alone, with a stand-in for python3 whose `-m venv` fails the way
    Debian's does without python3-venv: it leaves a venv with a python and no pip."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\n" + fake_python_body)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "--no-print-directory", f"VENV={tmp_path / 'venv'}", f"STAMPS={tmp_path / 'stamps'}",
                           f"PYTHON={fake}", "CFLAGS=-O2", str(tmp_path / "stamps" / "venv")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


DEBIAN_WITHOUT_VENV = ('if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; printf "#!/bin/sh\\nexit 1\\n" > "$3/bin/python";'
                       ' chmod +x "$3/bin/python"; echo "The virtual environment was not created successfully because'
                       ' ensurepip is not available." >&2; exit 1; fi\nexit 1\n')


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_failed_venv_names_the_missing_package_and_leaves_nothing_behind(tmp_path):
    result = make_venv(tmp_path, DEBIAN_WITHOUT_VENV)
    assert result.returncode != 0
    assert "sudo apt-get install -y python3-venv" in result.stdout, result.stdout + result.stderr
    assert not (tmp_path / "venv").exists(), "a half-made venv would be taken for a good one by the next make"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_venv_without_pip_is_made_again(tmp_path):
    (tmp_path / "venv" / "bin").mkdir(parents=True)  # what an earlier failed `python3 -m venv` left
    (tmp_path / "venv" / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "venv" / "bin" / "python").chmod(0o755)
    result = make_venv(tmp_path, DEBIAN_WITHOUT_VENV)
    assert "has no working pip" in result.stdout and "creating it again" in result.stdout, result.stdout
    assert "python3-venv" in result.stdout and not (tmp_path / "venv").exists()
