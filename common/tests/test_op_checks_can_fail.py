"""The operator checks (eml.common.op_checks) are only worth something if they fail on broken
operators: each broken op or model below must be caught by the check named beside it. The
operators are registered with torch.library.custom_op in a namespace of their own."""

import pytest
import torch
import torch.nn.functional as F

from eml.common import op_checks


# A correct op, the baseline every broken one differs from in one way.
@torch.library.custom_op("eml_checks::linear_ok", mutates_args=())
def linear_ok(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(input, weight, bias)


@linear_ok.register_fake
def _(input, weight, bias):
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


def _backward(ctx, grad):
    input, weight = ctx.saved_tensors
    grad_2d = grad.reshape(-1, grad.shape[-1])
    return grad @ weight, grad_2d.t() @ input.reshape(-1, input.shape[-1]), grad_2d.sum(0) if ctx.bias else None


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.bias = inputs[2] is not None


linear_ok.register_autograd(_backward, setup_context=_setup)


# Broken 1: the fake kernel says one more output feature than the real kernel returns.
@torch.library.custom_op("eml_checks::linear_wrong_fake", mutates_args=())
def linear_wrong_fake(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(input, weight, bias)


@linear_wrong_fake.register_fake
def _(input, weight, bias):
    return input.new_empty((*input.shape[:-1], weight.shape[0] + 1))


# Broken 2: the schema says nothing is mutated, and the kernel writes into its input.
@torch.library.custom_op("eml_checks::linear_lying_schema", mutates_args=())
def linear_lying_schema(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    output = F.linear(input, weight, bias)
    input.add_(1.0)  # an undeclared write into an argument
    return output


@linear_lying_schema.register_fake
def _(input, weight, bias):
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


# Broken 3: the backward doubles grad_input.
@torch.library.custom_op("eml_checks::linear_wrong_grad", mutates_args=())
def linear_wrong_grad(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(input, weight, bias)


@linear_wrong_grad.register_fake
def _(input, weight, bias):
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


def _wrong_backward(ctx, grad):
    grad_input, grad_weight, grad_bias = _backward(ctx, grad)
    return 2 * grad_input, grad_weight, grad_bias


linear_wrong_grad.register_autograd(_wrong_backward, setup_context=_setup)


def layer_on(op):
    class Layer(torch.nn.Linear):
        def forward(self, input):
            return op(input, self.weight, self.bias)

    return Layer


class BreaksTheGraph(torch.nn.Linear):
    def forward(self, input):
        torch._dynamo.graph_break()  # what an opaque pybind11 call does to dynamo
        return super().forward(input)


class FixedBatch(torch.nn.Linear):
    def forward(self, input):
        return super().forward(input) + torch.zeros(4, 1)  # only right for a batch of 4


SAMPLES = op_checks.linear_samples(dtypes=[torch.float32], cases=op_checks.SAMPLE_CASES[:3])


def test_correct_op_passes_opcheck():
    op_checks.opcheck_all(torch.ops.eml_checks.linear_ok.default, SAMPLES)


def test_opcheck_catches_a_fake_kernel_of_the_wrong_shape():
    with pytest.raises(AssertionError, match=r"test_faketensor"):
        op_checks.opcheck_all(torch.ops.eml_checks.linear_wrong_fake.default, SAMPLES)


def test_opcheck_catches_an_undeclared_mutation():
    with pytest.raises(AssertionError, match=r"test_schema"):
        # Samples without gradients: with them, the missing autograd formula would fail first.
        op_checks.opcheck_all(torch.ops.eml_checks.linear_lying_schema.default,
                              [sample for sample in SAMPLES if sample.name.endswith("no-grad")])


def test_graph_break_is_caught():
    model = op_checks.mlp(BreaksTheGraph, sizes=(6, 5, 3))
    op_checks.assert_no_graph_break(op_checks.mlp(torch.nn.Linear, sizes=(6, 5, 3)), torch.randn(2, 6))
    with pytest.raises(AssertionError, match=r"graph break"):
        op_checks.assert_no_graph_break(model, torch.randn(2, 6))


def test_compiled_wrong_gradient_is_caught():
    reference = op_checks.mlp(torch.nn.Linear, sizes=(6, 5, 3))
    op_checks.assert_compiled_matches(op_checks.mlp(layer_on(linear_ok), sizes=(6, 5, 3)), reference, [3], backend="eager")
    with pytest.raises(AssertionError, match=r"grad_input"):
        op_checks.assert_compiled_matches(op_checks.mlp(layer_on(linear_wrong_grad), sizes=(6, 5, 3)), reference, [3],
                                          backend="eager")


def test_bf16_mlp_with_a_wrong_gradient_is_caught():
    op_checks.assert_bf16_mlp_close_to_float32(layer_on(linear_ok))
    with pytest.raises(AssertionError, match=r"^0\.weight: Tensor-likes are not close"):
        op_checks.assert_bf16_mlp_close_to_float32(layer_on(linear_wrong_grad))


def test_export_that_only_works_for_the_example_batch_is_caught():
    op_checks.assert_export_runs(op_checks.mlp(torch.nn.Linear, sizes=(6, 3)), torch.randn(4, 6), [1, 9])
    # export itself refuses: the model specialises the batch that was declared dynamic
    with pytest.raises(torch._dynamo.exc.UserError, match=r"Constraints violated \(batch\)"):
        op_checks.assert_export_runs(op_checks.mlp(FixedBatch, sizes=(6, 3)), torch.randn(4, 6), [1, 9])


BROKEN_FOR_DDP = """
import torch, torch.nn.functional as F


class DetachesWeight(torch.nn.Linear):
    \"\"\"Computes the right output but cuts its weight out of the graph: no weight gradient.\"\"\"

    def forward(self, input):
        return F.linear(input, self.weight.detach(), self.bias)
"""


def test_ddp_check_fails_on_a_layer_that_loses_its_weight_gradient(tmp_path, monkeypatch):
    (tmp_path / "broken_for_ddp.py").write_text(BROKEN_FOR_DDP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the ranks are fresh processes
    with pytest.raises(AssertionError, match="got no gradient"):
        op_checks.assert_ddp_matches_one_process("broken_for_ddp:DetachesWeight", tmp_path)


def test_ddp_check_passes_on_nn_linear(tmp_path):
    op_checks.assert_ddp_matches_one_process("torch.nn:Linear", tmp_path)
