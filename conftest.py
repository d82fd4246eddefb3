"""The test session's background builds: compile while the other tests run.

Some tests build C++ themselves: the JIT route of stages 03, 10, 11 and 17, stage 12's kernels
emulated on the CPU, and the install routes of tests/test_install_routes.py. Each such build is
a minute or two of compiling on a 2-core Zen 3, most of it one compiler process on one core,
while the rest of the suite (small tensors, Python-bound) leaves the second core of a 2-core machine mostly idle.

So a test module may define `build_in_background(folder)`: the same build its tests make, into
`folder`. When the session has collected its tests, this file starts one process, at the lowest
priority (nice 19 for its session's autogroup: it takes only the cycles the tests and the
notebooks' kernels leave), that calls the function of each module with a selected test that uses
the fixture, in turn, in collection order. The tests then make their build again in the same
folder (fixture `background_builds`) and find it done, or wait for it; they run last of all
(pytest_collection_modifyitems below), so that there is little to wait. torch's JIT build waits
on its lock file; the install routes take a lock of their own. If a build fails in the
background, the install route's test installs again and shows why; a JIT test fails to load the
module, and the compiler's error is in the session's summary: the process's output lands in
background.log in the folder, and in that summary at the end, when the folder goes. The process
stops itself (and its compilers) if pytest goes first, killed by `timeout`, say.
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


def pytest_collection_modifyitems(items):
    """The tests that use the background builds run last, in their order: the other tests run
    while the builds compile. (A test that reaches its build before the background has made it
    waits for it, and leaves a core idle: stage 11's JIT test and stage 12's emulated kernels
    each waited about 50 s in their place, on a 2-core Zen 3.) Module-scoped fixtures of a module
    split in two are simply set up again for its second part."""
    last = [item for item in items if "background_builds" in getattr(item, "fixturenames", ())]
    if last:
        first = [item for item in items if "background_builds" not in getattr(item, "fixturenames", ())]
        items[:] = first + last


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
    """In the child: the lowest priority there is, for it and for the compilers it starts.

    Linux's autogroup scheduling (on by default on desktop and server kernels) shares the CPU
    between sessions first and only then, inside each session, by nice values: a session's
    processes all together get as much as any other session's. The notebooks' kernels run in
    sessions of their own (jupyter starts them so), so a builder in pytest's session, at nice 19,
    still took one of two cores from a kernel's two OpenMP threads: notebook 09's training cell
    took 27 s beside it on a 2-core Zen 3, 12 s alone. So the child starts a session of its own (also a
    process group of its own: its compilers are stopped with it) and gives that session's
    autogroup nice 19. Raising a nice value needs no privilege; where the kernel has no
    autogroups the file is absent, and the process's own nice 19 is what counts."""
    os.setsid()
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write("19")
    except OSError:
        pass
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
