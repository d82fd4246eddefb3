"""Every stage folder has the same shape, so that `diff -ru` between a stage and the one it grew
from prints the lesson and nothing else (README: "The shape of a stage").

LESSONS names, for every stage, the stage it was copied from and the files it adds or drops on
purpose; every other file must exist in both, under the same relative path. A stage that starts
a new example (or a new way to extend PyTorch) names no predecessor. A new stage folder fails
this test until it is entered here.
"""

import difflib
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# stage: (the stage it grew from or None, files it adds, files it drops)
LESSONS = {
    "01_python_layer": (None, set(), set()),
    "02_python_function": ("01_python_layer", set(), set()),
    # A detour: pybind11 on its own, before any linear-layer code goes to C++.
    "03_hello_cpp": ("02_python_function", {"src/hello.cpp", "src/jit.py"}, {"src/layer.py"}),
    "04_cpp_aten": ("02_python_function", {"src/FunctionCpp.cpp"}, set()),
    "05_cpp_naive": ("04_cpp_aten", set(), set()),
    "06_tpp": ("05_cpp_naive", {"benchmark.py", "src/FunctionCpp.h", "src/bindings.cpp", "src/blocked_gemm.h", "src/kernel.h",
                                "src/linear_state.h", "src/products.h", "src/tools.cpp"}, set()),
    "07_tpp_bf16": ("06_tpp", {"src/vnni_gemm.h"}, set()),
    # 06's training benchmark gives way to the benchmark of where a functional op keeps its state.
    "08_custom_op": ("06_tpp", {"bench_state.py", "src/ops.py"}, {"benchmark.py"}),
    # The second example, the LLTM cell, starts again from Python.
    "09_lltm_python": (None, set(), set()),
    "10_lltm_cpp": ("09_lltm_python", {"src/jit.py", "src/lltm.cpp"}, set()),
    "11_lltm_fused": ("10_lltm_cpp", {"breakdown.py"}, set()),
    "12_lltm_cuda": ("11_lltm_fused", {"benchmark.py", "compile_check.sh", "gpu_run.sh", "src/lltm_cuda.cpp", "src/lltm_cuda_kernel.cu"},
                     {"src/lltm.cpp", "breakdown.py"}),
    # The other ways to extend PyTorch, each a topic of its own.
    "13_c_ffi": (None, set(), set()),
    "14_autograd_recipes": (None, set(), set()),
    "15_tensor_subclasses": (None, set(), set()),
    # 08 again, on LibTorch's stable ABI: a benchmark against 08 and the second-torch check.
    "16_stable_abi": ("08_custom_op", {"benchmark.py", "other_torch_check.sh"}, {"bench_state.py"}),
    # 11 again, its GEMMs on LIBXSMM's kernels.
    "17_lltm_xsmm": ("11_lltm_fused", set(), set()),
}

# Every stage folder holds at least these.
REQUIRED = {"README.md", "setup.py", "src/__init__.py", "tests/test_stage.py"}

DIFF_OPTIONS = "-x build -x '*.egg-info' -x __pycache__"


def stage_folders():
    return sorted(p.name for p in ROOT.iterdir() if p.is_dir() and re.fullmatch(r"\d\d_\w+", p.name))


def tracked_files(stage):
    """The stage's files as git tracks them (build outputs are never tracked), relative to it."""
    out = subprocess.run(["git", "ls-files", stage], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line[len(stage) + 1:] for line in out.splitlines()}


def test_every_stage_folder_is_declared():
    undeclared = sorted(set(stage_folders()) - set(LESSONS))
    assert not undeclared, f"add these stages to LESSONS in {__file__}: {undeclared}"


@pytest.mark.parametrize("stage", stage_folders())
def test_stage_has_the_common_shape(stage):
    missing = sorted(REQUIRED - tracked_files(stage))
    assert not missing, f"{stage} lacks {missing}"
    setup = (ROOT / stage / "setup.py").read_text()
    assert re.search(r'package_dir=\{"eml\.[\w.]+": "src"\}', setup), f"{stage}/setup.py: map the package to src/ with package_dir"


@pytest.mark.parametrize("stage", [s for s in stage_folders() if s in LESSONS and LESSONS[s][0]])
def test_diff_with_the_previous_stage_is_the_lesson(stage):
    previous, added, dropped = LESSONS[stage]
    before, after = tracked_files(previous), tracked_files(stage)
    assert after - before == added, f"{stage} adds {sorted(after - before)}; declared: {sorted(added)}"
    assert before - after == dropped, f"{stage} drops {sorted(before - after)}; declared: {sorted(dropped)}"
    # The README shows the command that prints the lesson.
    command = f"diff -ru {DIFF_OPTIONS} {previous} {stage}"
    assert command in (ROOT / stage / "README.md").read_text(), f"{stage}/README.md should show `{command}`"


def test_the_check_fails_on_a_renamed_file(monkeypatch):
    """The guard itself can fail: a stage that renames its test file no longer matches."""
    real = tracked_files
    renamed = lambda stage: {"tests/test_05.py" if f == "tests/test_stage.py" else f for f in real(stage)}
    monkeypatch.setitem(globals(), "tracked_files", lambda stage: renamed(stage) if stage == "05_cpp_naive" else real(stage))
    with pytest.raises(AssertionError, match="test_05.py"):
        test_diff_with_the_previous_stage_is_the_lesson("05_cpp_naive")


# ---- No line of C++ or of src/*.py that only renames the stage -----------------------------
#
# Each compiled stage names itself once (kStage, the first word of its messages) and keeps one
# C++ namespace across the stages that share code (tpp in 06, 07, 08 and 16), so a line that differs
# from the previous stage's only by the package's name is noise in the diff a student reads.

CPP_SUFFIXES = (".cpp", ".h", ".cu", ".cuh")
PY_SUFFIXES = (".py",)  # the Python of src/ only: setup.py and the tests must name the package
# The lines allowed to differ by the name alone: the one that names the stage (kStage in C++,
# STAGE in Python), and the imports of the stage's own package (eml.<package>).
NAMES_THE_STAGE = re.compile(r"\bkStage\s*=|^\s*STAGE\s*=|^\s*(from|import)\s+eml\.|^\s*from\s+\.\s+import")


def package_name(stage):
    """The last part of the stage's package, as setup.py maps it: "linear_tpp" for eml.linear_tpp."""
    setup = (ROOT / stage / "setup.py").read_text()
    return re.search(r'package_dir=\{"eml\.([\w.]+)": "src"\}', setup).group(1).split(".")[-1]


def renamed_only_lines(old_lines, new_lines, old_name, new_name):
    """The changed lines of new_lines that equal a changed line of old_lines once old_name is
    replaced by new_name (as a word): edits that rename the stage and do nothing else."""
    rename = lambda line: re.sub(rf"\b{re.escape(old_name)}\b", new_name, line)
    found = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "replace":
            continue
        renamed = {rename(line) for line in old_lines[i1:i2] if old_name in line and not NAMES_THE_STAGE.search(line)}
        found += [(j + 1, line) for j, line in enumerate(new_lines[j1:j2], start=j1) if line in renamed]
    return found


def cpp_rename_lines(stage, previous):
    old_name, new_name = package_name(previous), package_name(stage)
    found = []
    for path in sorted(tracked_files(stage) & tracked_files(previous)):
        if path.endswith(CPP_SUFFIXES) or (path.startswith("src/") and path.endswith(PY_SUFFIXES)):
            old_lines = (ROOT / previous / path).read_text().splitlines()
            new_lines = (ROOT / stage / path).read_text().splitlines()
            found += [f"{stage}/{path}:{n}: {line.strip()}" for n, line in
                      renamed_only_lines(old_lines, new_lines, old_name, new_name)]
    return found


@pytest.mark.parametrize("stage", [s for s in stage_folders() if s in LESSONS and LESSONS[s][0]])
def test_no_cpp_line_only_renames_the_stage(stage):
    previous = LESSONS[stage][0]
    found = cpp_rename_lines(stage, previous)
    assert not found, (f"these lines differ from {previous}'s only by the stage's name; name the stage once "
                       f"(kStage) and keep the namespace:\n" + "\n".join(found))


def test_the_rename_check_fails_on_a_renamed_message():
    """The guard itself can fail: a message prefix spelled out, and a namespace renamed."""
    old = ['namespace tpp {', 'TORCH_CHECK(ok, kStage, ": expected x");', '}']
    new = ['namespace tpp {', 'TORCH_CHECK(ok, "linear_op: expected x");', '}']
    assert renamed_only_lines(old, new, "linear_tpp", "linear_op") == []  # a real change: kept
    old = ['namespace linear_tpp {', 'TORCH_CHECK(ok, "linear_tpp: expected x");', 'int a;']
    new = ['namespace linear_op {', 'TORCH_CHECK(ok, "linear_op: expected x");', 'int a;']
    assert [n for n, _ in renamed_only_lines(old, new, "linear_tpp", "linear_op")] == [1, 2]
    old = ['const char* const kStage = "linear_tpp";', "int a;"]
    new = ['const char* const kStage = "linear_op";', "int a;"]
    assert renamed_only_lines(old, new, "linear_tpp", "linear_op") == []  # the one line that names the stage
    # Python (src/*.py): a message prefix spelled out is caught; STAGE and the package's imports are not
    old = ['STAGE = "linear_python"', 'raise ValueError("linear_python: expected x")', 'from eml.ext.linear_python import Layer']
    new = ['STAGE = "linear_python_function"', 'raise ValueError("linear_python_function: expected x")',
           'from eml.ext.linear_python_function import Layer']
    assert [n for n, _ in renamed_only_lines(old, new, "linear_python", "linear_python_function")] == [2]
