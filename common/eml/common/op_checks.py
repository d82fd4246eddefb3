"""Checks for a linear layer registered as a PyTorch operator (stage 08 and any later one).

A stage whose layer is a registered operator (TORCH_LIBRARY + torch.library registrations)
checks it through these helpers, so that every such stage is held to the same contract:

    from eml.common import op_checks
    op_checks.opcheck_all(torch.ops.eml.linear, op_checks.linear_samples())      # every sample
    op_checks.assert_no_graph_break(model, x)                   # torch._dynamo.explain
    op_checks.assert_compiled_matches(model, reference, [1, 7, 33])   # fullgraph, dynamic
    op_checks.assert_export_runs(model, x, [1, 9])              # torch.export, dynamic batch

Each raises AssertionError with what went wrong and on which sample; common/tests/
test_op_checks_can_fail.py shows each one failing on a deliberately broken operator.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import subprocess
import sys

import torch

from eml.common.checks import CASES, Case

# The dtypes of the linear family's operators: float32, float64 and bfloat16.
OP_DTYPES = [torch.float32, torch.float64, torch.bfloat16]

# The sample shapes: common's shape set without the slowest (opcheck runs each sample through
# fake tensors, autograd and AOTAutograd): awkward sizes, 1-D input, 0-size batches.
SAMPLE_CASES = [c for c in CASES if c.in_features * c.out_features <= 2000] + [Case((3, 2), 33, 65)]

# float32 / float64 as common's checks; bfloat16 rounds every result once (8 bits of mantissa).
TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}


@dataclasses.dataclass
class Sample:
    """One call of an operator: its positional arguments and a name for messages."""

    name: str
    args: tuple


def _tensor(shape, dtype, generator, requires_grad):
    return torch.randn(*shape, generator=generator).to(dtype).requires_grad_(requires_grad)


def linear_samples(dtypes=OP_DTYPES, cases=SAMPLE_CASES, seed=0):
    """(input, weight, bias-or-None) samples for a linear op: every case and dtype, with and
    without bias, each sample with one of the requires_grad patterns (none, all, input only,
    weight and bias only) in turn, so that every dtype meets every pattern on several shapes."""
    generator = torch.Generator().manual_seed(seed)
    patterns = list({"no-grad": (False, False, False), "all-grad": (True, True, True),
                     "input-grad": (True, False, False), "params-grad": (False, True, True)}.items())
    samples = []
    for dtype in dtypes:
        for index, case in enumerate(cases):
            for bias in (True, False):
                for pattern, (grad_x, grad_w, grad_b) in [patterns[(2 * index + bias) % len(patterns)]]:
                    x = _tensor((*case.leading, case.in_features), dtype, generator, grad_x)
                    w = _tensor((case.out_features, case.in_features), dtype, generator, grad_w)
                    b = _tensor((case.out_features,), dtype, generator, grad_b) if bias else None
                    name = f"{case}-{str(dtype).removeprefix('torch.')}-{'bias' if bias else 'nobias'}-{pattern}"
                    samples.append(Sample(name, (x, w, b)))
    return samples


def linear_backward_samples(dtypes=OP_DTYPES, cases=SAMPLE_CASES[::2], seed=1):
    """Samples for the three backward ops of a linear op, as dicts name -> [Sample]:
    grad_input(grad_output, weight), grad_weight(grad_output, input), grad_bias(grad_output)."""
    generator = torch.Generator().manual_seed(seed)
    samples = {"grad_input": [], "grad_weight": [], "grad_bias": []}
    for dtype in dtypes:
        for case in cases:
            for requires_grad in (False, True):
                gy = _tensor((*case.leading, case.out_features), dtype, generator, requires_grad)
                w = _tensor((case.out_features, case.in_features), dtype, generator, requires_grad)
                x = _tensor((*case.leading, case.in_features), dtype, generator, requires_grad)
                name = f"{case}-{str(dtype).removeprefix('torch.')}-{'grad' if requires_grad else 'nograd'}"
                samples["grad_input"].append(Sample(name, (gy, w)))
                samples["grad_weight"].append(Sample(name, (gy, x)))
                samples["grad_bias"].append(Sample(name, (gy,)))
    return samples


# ---- opcheck over the samples -------------------------------------------------------------
# opcheck's default tests: the schema is honest about mutation and aliasing; autograd is
# registered where a gradient may be asked for; the fake kernel agrees with the real one
# (shapes, dtypes, strides); AOTAutograd with dynamic shapes gives the eager results.
OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def opcheck_all(op, samples, test_utils=OPCHECK_TESTS):
    """torch.library.opcheck on every sample; fails naming the sample and the test. Returns
    {test: "SUCCESS" count} for a report."""
    counts = {}
    for sample in samples:
        result = torch.library.opcheck(op, sample.args, test_utils=test_utils, raise_exception=False)
        failed = {test: outcome for test, outcome in result.items() if outcome != "SUCCESS"}
        assert not failed, f"opcheck of {op} failed on sample {sample.name}: " + "; ".join(
            f"{test}: {str(outcome).splitlines()[0] if str(outcome) else repr(outcome)}" for test, outcome in failed.items()
        )
        for test in result:
            counts[test] = counts.get(test, 0) + 1
    return counts


# ---- torch.compile ------------------------------------------------------------------------
def mlp(make_layer, sizes=(16, 33, 9, 5), dtype=torch.float32, seed=0, activations=(torch.nn.ReLU, torch.nn.GELU)):
    """Linear - ReLU - Linear - GELU - Linear ... on ``make_layer(in, out)`` layers (the
    activations between layers cycle through ``activations``), with the weights of the same MLP
    built from torch.nn.Linear (seeded), so two MLPs compare exactly."""
    torch.manual_seed(seed)
    modules = []
    for index, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        reference = torch.nn.Linear(n_in, n_out)
        layer = make_layer(n_in, n_out)
        layer.load_state_dict(reference.state_dict())
        modules.append(layer)
        if index < len(sizes) - 2:
            modules.append(activations[index % len(activations)]())
    return torch.nn.Sequential(*modules).to(dtype)


def assert_bf16_mlp_close_to_float32(make_layer, batch=9, tolerance=0.05):
    """mlp(make_layer) in bfloat16 against mlp(torch.nn.Linear) in float32: the output and every
    parameter's gradient (bfloat16, within ``tolerance``). The float32 reference starts from the
    same bf16-rounded weights and input, so that a ReLU near 0 cannot switch on one side only:
    what differs is the rounding inside the network (8 bits: a few roundings of 2^-8 on values of
    order one)."""
    model = mlp(make_layer).bfloat16()
    reference = mlp(torch.nn.Linear)
    with torch.no_grad():
        for p in reference.parameters():
            p.copy_(p.bfloat16().float())
    x = torch.randn(batch, reference[0].in_features).bfloat16()
    torch.testing.assert_close(model(x).float(), reference(x.float()), rtol=tolerance, atol=tolerance)
    model(x).sum().backward()
    reference(x.float()).sum().backward()
    for (name, p), r in zip(model.named_parameters(), reference.parameters()):
        assert p.grad.dtype == torch.bfloat16, f"{name}: gradient in {p.grad.dtype}, not bfloat16"
        torch.testing.assert_close(p.grad.float(), r.grad, rtol=tolerance, atol=tolerance, msg=lambda m: f"{name}: {m}")


def assert_no_graph_break(model, *args):
    """torch._dynamo.explain: one graph, no break; the message lists the break reasons."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(*args)
    reasons = [str(getattr(b, "reason", b)).splitlines()[0] for b in explanation.break_reasons]
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, (
        f"{explanation.graph_count} graph(s), {explanation.graph_break_count} graph break(s): {reasons}"
    )
    return explanation


def _outputs_and_grads(model, input, grad_seed=1):
    input = input.detach().requires_grad_()
    output = model(input)
    generator = torch.Generator().manual_seed(grad_seed)
    grad_output = torch.randn(output.shape, generator=generator).to(output.dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(output, [input, *params], grad_output)
    return [output.detach(), *grads]


def assert_compiled_matches(model, reference, batch_sizes, in_features=None, dtype=None, backend="inductor"):
    """torch.compile(model, fullgraph=True, dynamic=True) on every batch size: output, grad_input
    and every parameter's gradient agree with the eager ``reference`` (e.g. the same MLP on
    nn.Linear) to the dtype's tolerance. A graph break fails (fullgraph=True raises)."""
    first = next(model.parameters())
    in_features = in_features or first.shape[1]
    dtype = dtype or first.dtype
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=backend)
    for n in batch_sizes:
        input = torch.randn(n, in_features, generator=torch.Generator().manual_seed(n)).to(dtype)
        got = _outputs_and_grads(compiled, input)
        want = _outputs_and_grads(reference, input)
        names = ["output", "grad_input"] + [f"grad {name}" for name, p in model.named_parameters() if p.requires_grad]
        for name, g, w in zip(names, got, want):
            assert g.shape == w.shape, f"batch {n}, {name}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
            torch.testing.assert_close(g, w, **TOLERANCES[dtype], msg=lambda m: f"compiled, batch {n}, {name}: {m}")
    return compiled


# ---- torch.export -------------------------------------------------------------------------
def assert_export_runs(model, example, new_batch_sizes, batch_min=1):
    """torch.export.export with a dynamic batch dimension (dim 0 of the one input), then the
    exported program run on new batch sizes: each output equals the eager model's."""
    batch = torch.export.Dim("batch", min=batch_min)
    exported = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    program = exported.module()
    dtype = example.dtype
    for n in new_batch_sizes:
        input = torch.randn(n, *example.shape[1:], generator=torch.Generator().manual_seed(n)).to(dtype)
        with torch.no_grad():
            got, want = program(input), model(input)
        torch.testing.assert_close(got, want, **TOLERANCES[dtype], msg=lambda m: f"exported program, batch {n}: {m}")
    return exported


def round_trip(module):
    """copy.deepcopy and a torch.save / torch.load round trip of a module (for state checks)."""
    import io

    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return copy.deepcopy(module), torch.load(buffer, weights_only=False)


# -- DistributedDataParallel: two ranks on gloo against one process --------------------------------
_DDP_RANK = """
import sys, importlib, torch, torch.distributed as dist
from eml.common import op_checks
module, name = {factory!r}.split(":")
make_layer = getattr(importlib.import_module(module), name)
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method={init!r}, rank=rank, world_size=2)
model = torch.nn.parallel.DistributedDataParallel(op_checks.mlp(make_layer))
x = torch.load({data!r})
model(x.chunk(2)[rank]).pow(2).mean().backward()
torch.save([p.grad for p in model.module.parameters()], {out!r}.format(rank))
dist.barrier()
dist.destroy_process_group()
"""


def assert_ddp_matches_one_process(factory, tmp_path, batch=10):
    """Two processes train ``op_checks.mlp(make_layer)`` under DistributedDataParallel (gloo),
    each on half of one batch; their averaged gradients must equal one process's on the whole
    batch. ``factory`` names the layer as "module:attribute", importable in a fresh process.
    torch 2.13's gloo teardown sometimes aborts a rank after its work is done, so the ranks are
    judged by the gradients they saved, not by their exit codes."""
    module, name = factory.split(":")
    make_layer = getattr(importlib.import_module(module), name)
    x = torch.randn(batch, 16, generator=torch.Generator().manual_seed(0))
    torch.save(x, tmp_path / "x.pt")
    script = _DDP_RANK.format(factory=factory, init=f"file://{tmp_path / 'rendezvous'}", data=str(tmp_path / "x.pt"),
                              out=str(tmp_path / "grads{}.pt"))
    ranks = [subprocess.Popen([sys.executable, "-c", script, str(rank)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in range(2)]
    try:
        logs = [rank.communicate(timeout=300)[0] for rank in ranks]
    finally:
        for rank in ranks:  # a rank still waiting for the other after a timeout
            rank.kill()
    saved = [tmp_path / f"grads{rank}.pt" for rank in range(2)]
    assert all(path.exists() for path in saved), f"a rank saved no gradients: {logs}"
    model = mlp(make_layer)
    model(x).pow(2).mean().backward()
    for rank, path in enumerate(saved):
        for index, (got, param) in enumerate(zip(torch.load(path), model.parameters())):
            assert got is not None, f"rank {rank}: parameter {index} got no gradient"
            torch.testing.assert_close(got, param.grad, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank}, parameter {index}: DDP's gradient differs: {m}")
