"""The LLTM benchmark times a compiled cell compiled at every shape, and no garbage collection.

torch.compile keeps one cache per compiled function, shared by every cell built from the same
class; past its recompile limit a compiled cell runs eager with only a logged warning, and the
benchmark's row for it would time eager PyTorch under the compiled label. The test lowers the
limit to 2 and times four shapes, counting through a backend of its own how many of each
shape's calls ran the compiled graph.
"""

import gc

import pytest
import torch

from eml.common import lltm_bench
from eml.common.lltm_checks import ReferenceLLTM

SHAPES = [(2, 3, 4), (3, 4, 5), (4, 5, 6), (5, 6, 7)]
WARMUP, RUNS, ROUNDS = 1, 2, 1
CALLS = WARMUP + RUNS * ROUNDS  # forward calls of the cell per shape in time_cells


@pytest.fixture(autouse=True)
def fresh_dynamo_cache():
    """Each test starts and ends with an empty cache, so that neither leaves the other (or a
    later test) a cache already at the limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def recording_cell_maker(ran):
    """factory(features, state) -> a ReferenceLLTM compiled with a backend that appends to
    `ran` each time the compiled graph runs."""
    def backend(graph_module, example_inputs):
        def run(*args):
            ran.append(True)
            return graph_module.forward(*args)
        return run

    def make(features, state):
        cell = ReferenceLLTM(features, state)
        cell.compile(backend=backend)
        return cell
    return make


def time_every_shape(make, ran):
    """{shape: how many of time_cells' calls of the cell ran the compiled graph}."""
    compiled_calls = {}
    for shape in SHAPES:
        ran.clear()
        lltm_bench.time_cells({"compiled": make}, shape, runs=RUNS, rounds=ROUNDS, warmup=WARMUP)
        compiled_calls[shape] = len(ran)
    return compiled_calls


def test_a_compiled_cell_is_timed_compiled_at_every_shape():
    ran = []
    with torch._dynamo.config.patch(recompile_limit=2):
        compiled_calls = time_every_shape(recording_cell_maker(ran), ran)
    assert all(n == CALLS for n in compiled_calls.values()), f"compiled calls of {CALLS} per shape: {compiled_calls}"


def test_without_the_reset_the_recompile_limit_turns_the_cell_eager(monkeypatch):
    # The check above can fail: with time_cells' reset removed, the shared cache fills up and
    # the later shapes run eager.
    monkeypatch.setattr(torch._dynamo, "reset", lambda: None)
    ran = []
    with torch._dynamo.config.patch(recompile_limit=2):
        compiled_calls = time_every_shape(recording_cell_maker(ran), ran)
    assert any(n == 0 for n in compiled_calls.values()), compiled_calls


def test_no_garbage_collection_inside_the_timed_calls():
    # The warm-up runs with the collector on (it may compile); the timed calls without it, as
    # timeit does; afterwards it is on again.
    enabled = []

    class Probe(ReferenceLLTM):
        def forward(self, input, state):
            enabled.append(gc.isenabled())
            return super().forward(input, state)

    lltm_bench.time_cells({"probe": Probe}, SHAPES[0], runs=RUNS, rounds=ROUNDS, warmup=WARMUP)
    assert enabled == [True] * WARMUP + [False] * (RUNS * ROUNDS)
    assert gc.isenabled()


def test_the_floor_cell_computes_nothing_but_has_a_cells_shapes_and_gradients():
    features, state = 3, 4
    cell = lltm_bench.FloorCell(features, state)
    reference = ReferenceLLTM(features, state)
    assert {name: p.shape for name, p in cell.named_parameters()} == \
        {name: p.shape for name, p in reference.named_parameters()}, "time_cells loads the first cell's state_dict"
    input, old_h, old_cell = torch.randn(2, features), torch.randn(2, state), torch.randn(2, state)
    new_h, new_cell = cell(input, (old_h, old_cell))
    assert new_h.shape == old_h.shape and new_cell.shape == old_cell.shape
    torch.autograd.backward([new_h, new_cell], [torch.ones_like(new_h), torch.ones_like(new_cell)])
    assert cell.weights.grad.shape == cell.weights.shape and cell.bias.grad.shape == cell.bias.shape
    assert lltm_bench.saved_bytes(lltm_bench.FloorCell, (2, features, state)) == 0


def test_the_floor_row_is_timed_beside_the_cells():
    lines = []
    lltm_bench.benchmark({"reference": ReferenceLLTM, lltm_bench.FLOOR_LABEL: lltm_bench.FloorCell}, [SHAPES[0]],
                         runs=RUNS, rounds=ROUNDS, out=lines.append)
    floor_line = next(line for line in lines if lltm_bench.FLOOR_LABEL in line)
    assert "Forward:" in floor_line and "Backward:" in floor_line and "saved 0 KiB" in floor_line, floor_line


def test_the_floor_cell_runs_the_node_it_is_given():
    calls = []

    def node(input, weights, bias, old_h, old_cell):
        calls.append((weights.shape, bias.shape))
        return old_h * 2, old_cell * 3

    cell = lltm_bench.FloorCell(3, 4, node=node)
    old_h, old_cell = torch.randn(2, 4), torch.randn(2, 4)
    new_h, new_cell = cell(torch.randn(2, 3), (old_h, old_cell))
    assert calls == [(torch.Size([12, 7]), torch.Size([12]))]
    assert torch.equal(new_h, old_h * 2) and torch.equal(new_cell, old_cell * 3)


def test_floor_adds_the_python_floor_and_every_stages_floors(monkeypatch):
    stage = {"cells": {"reference": ReferenceLLTM}, "floors": {"a stage's floor": lltm_bench.FloorCell}}
    assert lltm_bench.discover_cells([("99_stage", stage)]) == {"reference": ReferenceLLTM}
    assert lltm_bench.discover_cells([("99_stage", stage)], key="floors") == stage["floors"]
    timed = []
    monkeypatch.setattr(lltm_bench, "discover_cells", lambda key="cells": dict(stage[key]))
    monkeypatch.setattr(lltm_bench, "benchmark", lambda makers, shapes, **options: timed.append(list(makers)))
    assert lltm_bench.main(["--floor"]) == 0
    assert lltm_bench.main([]) == 0
    assert timed == [["reference", lltm_bench.FLOOR_LABEL, "a stage's floor"], ["reference"]]


def test_a_shape_of_ones_own_is_three_integers_of_at_least_one(capsys):
    assert lltm_bench.parse_shape("1,1,1") == (1, 1, 1)
    assert lltm_bench.parse_shape("16,32,128") == (16, 32, 128)
    for text in ("16,32", "0,1,1", "a,b,c", "1,2,3,4"):
        with pytest.raises(SystemExit) as refusal:
            lltm_bench.main(["--shape", text])
        assert refusal.value.code == 2
        assert f"wants three integers >= 1 as batch,features,state, got '{text}'" in capsys.readouterr().err


def test_a_shape_of_ones_own_is_the_one_timed(monkeypatch):
    timed = []
    monkeypatch.setattr(lltm_bench, "discover_cells", lambda key="cells": {"reference": ReferenceLLTM})
    monkeypatch.setattr(lltm_bench, "benchmark", lambda makers, shapes, **options: timed.append(shapes))
    assert lltm_bench.main(["--shape", "1,2,3"]) == 0
    assert lltm_bench.main([]) == 0
    assert timed == [[(1, 2, 3)], lltm_bench.SHAPES]
