"""The two install routes each stage README gives work inside the set-up's environment:
the course's `python setup.py install` and `pip install --no-build-isolation .`.

Each route installs a copy of a stage (or the stage itself) into a temporary prefix (not into
.venv, which `make` owns); a fresh interpreter then imports the stage from there, runs it, and
finds its tour entry point. Stage 02 stands for the Python stages, stage 03 for the C++ ones,
stage 06 for the one that links a third-party library (LIBXSMM), stage 08 for the abi3 build of
registered operators, and stage 13 for the one whose build makes a plain C shared library beside
the package. The C++ stages 03, 06 and 08 go by `setup.py install` only: `make` has built and
installed each of them the pip way already (CASES below); 06 and 08 are installed from their own
folders, where `make` compiled them (IN_PLACE below).

Each case works in a folder of its own under the session's `background_builds` (the root
conftest.py): `build_in_background` below makes every install there as the session begins, at
low priority, and each test then makes its install again in the same folder, which finds the
compiling done (or waits on the case's lock until it is). These tests run last (pytest.ini's
testpaths, and the root conftest.py runs the tests that use background builds last of all), so
that the builds have the whole session to finish in.
"""

import contextlib
import fcntl
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROUTES = ["setup.py install", "pip install --no-build-isolation"]

RUN = {
    "02_python_function": "import torch; assert module.Layer(5, 3)(torch.randn(2, 5)).shape == (2, 3)",
    "03_hello_cpp": "module.hello()",
    "06_tpp": "import torch; assert module.Layer(5, 3)(torch.randn(2, 5)).shape == (2, 3)",
    "08_custom_op": "import torch; assert module.Layer(5, 3)(torch.randn(2, 5)).shape == (2, 3); torch.ops.eml.linear.default",
    "13_c_ffi": "import torch; x = torch.randn(3); assert torch.equal(module.AddModule()(x, 4 * x), 5 * x)",
}
MODULES = {"02_python_function": "eml.ext.linear_python_function", "03_hello_cpp": "eml.hello_cpp", "06_tpp": "eml.linear_tpp",
           "08_custom_op": "eml.linear_op", "13_c_ffi": "eml.c_ffi"}
# The Python stages and stage 13 by every route; the other C++ stages by setup.py install only. Their
# pip route is built already: `make` installs every stage with pip install --no-build-isolation, the
# stages' tests import what it installed and the tour finds their entry points, and stage 08's wheel
# test builds it the pip way once more. The builds skipped here take about 10 s (03) and one to two
# minutes each (06, 08) on 2 cores (Zen 3).
PIP_ROUTE_BUILT_ELSEWHERE = {"03_hello_cpp", "06_tpp", "08_custom_op"}
CASES = [(route, stage) for stage in sorted(RUN) for route in ROUTES
         if not (stage in PIP_ROUTE_BUILT_ELSEWHERE and route != "setup.py install")]
# Stages 06 and 08 take one to two minutes each to compile on 2 cores (Zen 3), and `make` has compiled both
# in their own build/ folders with the same setup.py, compiler flags and ninja (its pip route). So
# these two go by setup.py install from the stage folder itself, as a student runs the route there
# after `make`: ninja finds every object up to date, and setup.py links and installs, in seconds.
# Stage 03 is copied and compiled from scratch: the setup.py route's compile of a C++ stage.
# (The background skips the two: nothing to compile, and 08's build/ folder is also where its
# wheel test builds.)
IN_PLACE = {"06_tpp", "08_custom_op"}

CHECK = """
import sys, importlib, importlib.metadata
module = importlib.import_module(sys.argv[1])
assert module.__file__.startswith(sys.argv[2]), module.__file__
exec(sys.argv[4])
names = [p.name for p in importlib.metadata.entry_points(group="eml.tour")]
assert sys.argv[3] in names, names
print("ok", module.__file__, flush=True)
"""


@contextlib.contextmanager
def case_folder(folder, route, stage):
    """The case's own folder under folder, held locked (against the background build or a test)."""
    work = pathlib.Path(folder, "install_routes", f"{stage}-{route.split()[0]}")
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield work


def install(route, stage, work):
    """Install a copy of the stage (made once, in work/src), or the stage itself (IN_PLACE), by
    route into work/prefix; a second install of the same copy finds its build done."""
    source = ROOT / stage if stage in IN_PLACE else work / "src"
    if stage not in IN_PLACE and not (work / "copied").exists():  # not yet, or a copy cut short
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(ROOT / stage, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        (work / "copied").touch()
    prefix = work / "prefix"
    if route == "setup.py install":
        command = [sys.executable, "setup.py", "install", f"--prefix={prefix}"]
        site = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    else:
        # --upgrade: a second install replaces the first's files (pip --target keeps them otherwise)
        command = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--upgrade",
                   f"--target={prefix}", "."]
        site = prefix
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONWARNINGS="ignore")
    result = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return site, env


def build_in_background(folder):
    """Every case's install, which the root conftest.py starts as the session begins (see there),
    but for a case whose test came first."""
    for route, stage in CASES:
        if stage in IN_PLACE:
            continue
        with case_folder(folder, route, stage) as work:
            if (work / "tested").exists():
                continue
            try:
                install(route, stage, work)
            except AssertionError:
                print(f"  {stage} by {route} failed: its test installs again and shows why", flush=True)


@pytest.mark.parametrize("route, stage", CASES)
def test_stage_installs_and_runs(route, stage, background_builds):
    with case_folder(background_builds, route, stage) as work:  # held until the check is done
        (work / "tested").touch()  # the background installs it no more
        site, env = install(route, stage, work)
        result = subprocess.run(
            [sys.executable, "-c", CHECK, MODULES[stage], str(site), stage, RUN[stage]],
            env=env, capture_output=True, text=True, cwd=work,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("ok")
    if stage == "03_hello_cpp":
        assert result.stdout.splitlines()[0] == "Hello World!"
