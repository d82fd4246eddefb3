"""The LLTM benchmark times a compiled cell compiled, at every shape.

torch.compile keeps one cache per compiled function, shared by every cell built from the same
class; past its recompile limit a compiled cell runs eager with only a logged warning, and the
benchmark's row for it would time eager PyTorch under the compiled label. The test lowers the
limit to 2 and times four shapes, recording through a backend of its own whether the compiled
graph ran at each one.
"""

import pytest
import torch

from eml.common import lltm_bench
from eml.common.lltm_checks import ReferenceLLTM

SHAPES = [(2, 3, 4), (3, 4, 5), (4, 5, 6), (5, 6, 7)]


def recording_cell_maker(ran):
    """factory(features, state) -> a ReferenceLLTM compiled with a backend that appends the
    input's feature count to `ran` each time the compiled graph runs."""
    def backend(graph_module, example_inputs):
        def run(*args):
            ran.append(next(a.shape[-1] for a in args if isinstance(a, torch.Tensor) and a.dim() == 2))
            return graph_module.forward(*args)
        return run

    def make(features, state):
        cell = ReferenceLLTM(features, state)
        cell.compile(backend=backend)
        return cell
    return make


def time_every_shape(make, ran):
    """{shape: whether the compiled graph ran while time_cells timed it}."""
    compiled_at = {}
    for shape in SHAPES:
        ran.clear()
        lltm_bench.time_cells({"compiled": make}, shape, runs=2, rounds=1, warmup=1)
        compiled_at[shape] = bool(ran)
    return compiled_at


def test_a_compiled_cell_is_timed_compiled_at_every_shape():
    ran = []
    with torch._dynamo.config.patch(recompile_limit=2):
        compiled_at = time_every_shape(recording_cell_maker(ran), ran)
    assert all(compiled_at.values()), f"timed eager at {[s for s, c in compiled_at.items() if not c]}"


def test_without_the_reset_the_recompile_limit_turns_the_cell_eager(monkeypatch):
    # The check above can fail: with time_cells' reset removed, the shared cache fills up and
    # the later shapes run eager.
    monkeypatch.setattr(torch._dynamo, "reset", lambda: None)
    ran = []
    with torch._dynamo.config.patch(recompile_limit=2):
        compiled_at = time_every_shape(recording_cell_maker(ran), ran)
    assert not all(compiled_at.values()), compiled_at
