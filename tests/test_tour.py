"""The tour finds every installed stage through the `eml.tour` entry points and reports it."""

import importlib.metadata
import subprocess
import sys


def test_quick_tour_reports_every_installed_stage():
    result = subprocess.run([sys.executable, "-m", "eml.common.tour", "--quick"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    stages = [p.name for p in importlib.metadata.entry_points(group="eml.tour")]
    assert stages, "no stage registered itself"
    for name in stages:
        assert name in out, f"{name} missing from the tour"
    assert "FAIL" not in out
    # The float32 table: from the line after its "stage ... ---" header to the first blank line.
    # (Later sections, bf16 and dispatch overhead, have tables of their own.)
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("stage ") and "fwd us" in line)
    table = lines[header + 2:]
    rows = table[:table.index("")] if "" in table else table
    assert rows[0].startswith("torch.nn.Linear"), "torch.nn.Linear must be the first timing row"
    layers = [label for point in importlib.metadata.entry_points(group="eml.tour") for label in point.load().get("layers", {})]
    assert rows[1].startswith("numpy (OpenBLAS)"), "the second baseline: the same layer on numpy's BLAS"
    assert len(rows) == 2 + len(layers), "one timing row per layer, after the two baselines"
