"""The recurrent-cell contract is only worth something if it fails on wrong cells: each broken
cell below must be caught by the check named beside it, and the correct one must pass."""

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.gradcheck import GradcheckError

from eml.common import lltm_checks
from eml.common.lltm_checks import CellTests, ReferenceLLTM, Shape, reference_lltm


def checked(input, weights, bias, old_h, old_cell):
    """The reference with the checks a cell must make (messages as the stages write them)."""
    for name, t in zip(lltm_checks.ARGUMENTS, (input, weights, bias, old_h, old_cell)):
        if t.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"cell: {name} must be float32 or float64, got {t.dtype}")
        if t.dtype != input.dtype:
            raise TypeError(f"cell: {name} is {t.dtype} but input is {input.dtype}")
        if t.device != input.device:
            raise ValueError(f"cell: {name} is on {t.device} but input is on {input.device}")
    if input.dim() != 2:
        raise ValueError(f"cell: input must be 2-D, got shape {list(input.shape)}")
    B, S = input.shape[0], weights.shape[0] // 3
    for name, t in (("old_h", old_h), ("old_cell", old_cell)):
        if t.shape[0] != B:
            raise ValueError(f"cell: {name} has batch size {t.shape[0]} but input has {B}")
        if t.shape[1] != S:
            raise ValueError(f"cell: {name} must have shape [{B}, {S}], got {list(t.shape)}")
    if weights.shape[1] != S + input.shape[1]:
        raise ValueError(f"cell: input has {input.shape[1]} features, weights must be [{3 * S}, {S + input.shape[1]}], "
                         f"got {list(weights.shape)}")
    if bias.shape[-1] != 3 * S:
        raise ValueError(f"cell: bias must have shape ({3 * S}), got {list(bias.shape)}")
    return reference_lltm(input, weights, bias, old_h, old_cell)


class Good(ReferenceLLTM):
    def forward(self, input, state):
        return checked(input, self.weights, self.bias, *state)


def relu_candidate(input, weights, bias, old_h, old_cell):
    """Wrong forward: relu where the cell has elu (equal for positive gates only)."""
    checked(input, weights, bias, old_h, old_cell)
    S = old_h.shape[1]
    gates = F.linear(torch.cat([old_h, input], 1), weights, bias.reshape(-1))
    new_cell = old_cell + F.relu(gates[:, 2 * S:]) * torch.sigmoid(gates[:, :S])
    return torch.tanh(new_cell) * torch.sigmoid(gates[:, S:2 * S]), new_cell


class DropsOldCellGradient(torch.autograd.Function):
    """Wrong backward: right outputs, but the gradient of old_cell through new_cell is lost."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        ctx.save_for_backward(input, weights, bias, old_h, old_cell)
        return checked(input, weights, bias, old_h, old_cell)

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in ctx.saved_tensors]
            outputs = reference_lltm(*leaves)
            grads = torch.autograd.grad(outputs, leaves, (grad_h, grad_cell))
        return (*grads[:4], torch.zeros_like(grads[4]))


class UnrecordedBackward(DropsOldCellGradient):
    """Right first derivatives, but computed on detached leaves without create_graph: autograd
    records nothing of the backward, so second derivatives come out as zeros, silently."""

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in ctx.saved_tensors]
            outputs = reference_lltm(*leaves)
            return torch.autograd.grad(outputs, leaves, (grad_h, grad_cell))


class WrongSecondDerivatives(Good):
    def forward(self, input, state):
        return UnrecordedBackward.apply(input, self.weights, self.bias, *state)


class WrongForward(Good):
    def forward(self, input, state):
        return relu_candidate(input, self.weights, self.bias, *state)


class WrongBackward(Good):
    def forward(self, input, state):
        return DropsOldCellGradient.apply(input, self.weights, self.bias, *state)


class NoChecks(ReferenceLLTM):
    """Right answers, but bad input meets torch's own messages, which name neither the
    argument nor the sizes the cell expected."""


def harness(make_cell, function=None):
    tests = CellTests()
    tests.make_cell = make_cell
    tests.function = function
    return tests


def test_correct_cell_passes():
    tests = harness(Good, checked)
    tests.double_backward = True  # plain autograd: gradients of gradients work
    tests.test_module_matches_reference(Shape(7, 13, 33), torch.float64)
    tests.test_function_matches_reference(Shape(7, 13, 33), torch.float32)
    tests.test_function_gradcheck(Shape(3, 4, 5))
    tests.test_unrolled_sequence_follows_the_reference()
    tests.test_function_rejects_bad_input("batch of old_h")
    tests.test_module_rejects_wrong_feature_count()
    tests.test_module_double_backward_or_clear_refusal()


def test_double_backward_claim_is_checked():
    """A cell whose first derivatives are right (gradcheck passes) but whose backward autograd
    does not record: claiming double backward for it fails, on the second derivatives."""
    tests = harness(WrongSecondDerivatives, UnrecordedBackward.apply)
    tests.test_function_gradcheck(Shape(3, 4, 5))
    tests.double_backward = True
    with pytest.raises(GradcheckError, match=r"Numerical gradient for function expected to be zero"):  # the analytical one is, unrecorded
        tests.test_module_double_backward_or_clear_refusal()


@pytest.mark.parametrize("cell, function, test, args, message", [
    (WrongForward, relu_candidate, "test_module_matches_reference", (Shape(16, 32, 128), torch.float32), r"^new_h: .*not close"),
    (WrongForward, relu_candidate, "test_function_matches_reference", (Shape(3, 5, 31), torch.float64), r"^new_h: .*not close"),
    (WrongForward, relu_candidate, "test_unrolled_sequence_follows_the_reference", (), r"not close"),
    (WrongBackward, DropsOldCellGradient.apply, "test_module_matches_reference", (Shape(1, 7, 13), torch.float64),
     r"^grad_old_cell: .*not close"),
    (WrongBackward, DropsOldCellGradient.apply, "test_function_gradcheck", (Shape(3, 4, 5),),
     r"Jacobian mismatch for output 0 with respect to input 4"),
    (WrongBackward, DropsOldCellGradient.apply, "test_function_non_contiguous_inputs", (), r"^grad_old_cell: .*not close"),
    (NoChecks, reference_lltm, "test_function_rejects_bad_input", ("batch of old_h",), r"does not say 'old_h'"),
    (NoChecks, reference_lltm, "test_function_rejects_bad_input", ("bias size",), r"does not say 'bias'"),
    (NoChecks, reference_lltm, "test_function_rejects_bad_input", ("integer input",), r"DID NOT RAISE"),
    (NoChecks, reference_lltm, "test_module_rejects_wrong_feature_count", (), r"does not say '\(feature\|weights\)'"),
    (NoChecks, reference_lltm, "test_module_rejects_state_of_another_size", (), r"does not say '\(old_h\|weights\|state\)'"),
    (Good, checked, "test_function_second_backward_refused", (), r"DID NOT RAISE"),  # plain autograd: no refusal
], ids=lambda v: getattr(v, "__name__", None) if isinstance(v, type) or callable(v) else None)
def test_broken_cell_is_caught(cell, function, test, args, message):
    """Caught by the check named beside it, for the reason named beside it."""
    with pytest.raises((AssertionError, GradcheckError, pytest.fail.Exception), match=message):
        getattr(harness(cell, function), test)(*args)


def test_the_tour_header_names_the_lltm_stages_as_ranges():
    from eml.common.lltm_bench import stage_ranges

    assert stage_ranges(["09_lltm_python", "10_lltm_cpp", "11_lltm_fused", "17_lltm_xsmm"]) == "09-11, 17"
    assert stage_ranges(["11_lltm_fused"]) == "11"
