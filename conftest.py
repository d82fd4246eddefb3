"""The test session's background builds: compile while the other tests run.

Some tests build C++ themselves: the JIT route of stages 03, 10, 11 and 17, stage 12's kernels
emulated on the CPU, and the install routes of tests/test_install_routes.py. Each such build is
a minute or two of compiling, most of it one compiler process on one core, while the rest of the
suite (small tensors, Python-bound) leaves the second core of a 2-core machine mostly idle.

So a test module may define `build_in_background(folder)`: the same build its tests make, into
`folder`. When the session has collected its tests, this file starts one process, at the lowest
priority (nice 19: it takes only the cycles the tests leave), that calls the function of each
module with a selected test that uses the fixture, in turn, in collection order. The tests then
make their build again in the same folder (fixture `background_builds`) and find it done, or
wait for it: torch's JIT build waits on its lock file; the install routes take a lock of their
own. If a build fails in the background, the install route's test installs again and shows why;
a JIT test fails to load the module, and the compiler's error is in the session's summary: the
process's output lands in background.log in the folder, and in that summary at the end, when the
folder goes. The process stops itself (and its compilers) if pytest goes first, killed by
`timeout`, say.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

HOOK = "build_in_background"

# Run in the background process: argv[1] is the folder, the rest are test modules' paths.
RUNNER = """
import os, runpy, sys, threading, time, traceback
folder = sys.argv[1]
parent = os.getppid()

def stop_when_pytest_is_gone():
    while os.getppid() == parent:
        time.sleep(1)
    os.killpg(0, 9)

threading.Thread(target=stop_when_pytest_is_gone, daemon=True).start()
for path in sys.argv[2:]:
    start = time.perf_counter()
    try:
        runpy.run_path(path)["build_in_background"](folder)
        print(f"built for {path} in {time.perf_counter() - start:.0f} s", flush=True)
    except BaseException:
        print(f"FAILED for {path} (its tests fail too):", flush=True)
        traceback.print_exc()
        sys.stdout.flush()
"""

_folder = None
_process = None
_log = []  # the background process's output, kept for the summary


def pytest_collection_finish(session):
    global _folder, _process
    if session.config.option.collectonly:
        return
    paths = []
    for item in session.items:  # the modules with a selected test that uses the fixture below
        module = getattr(item, "module", None)
        uses_it = "background_builds" in getattr(item, "fixturenames", ())
        if uses_it and callable(getattr(module, HOOK, None)) and module.__file__ not in paths:
            paths.append(module.__file__)
    if not paths:
        return
    _folder = tempfile.mkdtemp(prefix="eml-background-builds-")
    with open(os.path.join(_folder, "background.log"), "w") as log:
        _process = subprocess.Popen([sys.executable, "-c", RUNNER, _folder, *paths], stdout=log,
                                    stderr=subprocess.STDOUT, preexec_fn=_lowest_priority)


def _lowest_priority():
    """In the child: a process group of its own (so that its compilers can be stopped with it),
    but not a session of its own: Linux's autogroup scheduling gives each session an equal share
    of the CPU whatever its processes' nice values, and the builds would take a whole core."""
    os.setpgid(0, 0)
    os.nice(19)


@pytest.fixture(scope="session")
def background_builds():
    """The folder the background builds go into (see this file's docstring): a pathlib.Path."""
    global _folder
    if _folder is None:  # none started (a test reached it by request.getfixturevalue): an empty one
        _folder = tempfile.mkdtemp(prefix="eml-background-builds-")
    return pathlib.Path(_folder)


def pytest_sessionfinish(session):
    global _log
    if _process is not None:
        try:
            _process.wait(timeout=5)  # done, or finishing its last line
        except subprocess.TimeoutExpired:
            os.killpg(_process.pid, 9)  # its compilers too
            _process.wait()
            _log.append("(stopped: the session ended first)")
    if _folder is not None:
        log = pathlib.Path(_folder, "background.log")
        _log = (log.read_text().splitlines() if log.exists() else []) + _log
        shutil.rmtree(_folder, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    if _log:
        terminalreporter.section("background builds (conftest.py)")
        for line in _log:
            terminalreporter.write_line(line)
