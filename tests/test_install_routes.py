"""The two install routes each stage README gives work inside the set-up's environment:
the course's `python setup.py install` and `pip install --no-build-isolation .`.

Each route installs a copy of a stage into a temporary prefix (not into .venv, which `make`
owns) and a fresh interpreter imports it from there and runs it.
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

CHECK = """
import sys, torch, importlib, importlib.metadata
module = importlib.import_module(sys.argv[1])
assert module.__file__.startswith(sys.argv[2]), module.__file__
layer = module.Layer(5, 3)
assert layer(torch.randn(2, 5)).shape == (2, 3)
names = [p.name for p in importlib.metadata.entry_points(group="eml.tour")]
assert sys.argv[3] in names, names
print("ok", module.__file__)
"""


def install(route, stage, tmp_path):
    source = tmp_path / "src"
    shutil.copytree(ROOT / stage, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    prefix = tmp_path / "prefix"
    if route == "setup.py install":
        command = [sys.executable, "setup.py", "install", f"--prefix={prefix}"]
        site = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    else:
        command = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", f"--target={prefix}", "."]
        site = prefix
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONWARNINGS="ignore")
    result = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return site, env


@pytest.mark.parametrize("route", ["setup.py install", "pip install --no-build-isolation"])
def test_python_stage_installs_both_ways(route, tmp_path):
    site, env = install(route, "02_python_function", tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", CHECK, "eml.ext.linear_python_function", str(site), "02_python_function"],
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
