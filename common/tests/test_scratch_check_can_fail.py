"""cpp_checks.assert_matches_torch_in_turns_and_on_two_threads is only worth something if it fails
on the bugs a per-thread scratch buffer invites. Each fake module below is a correct linear
layer (forward and backward in the shape compiled modules have) but for one such bug: a buffer
that never grows, or one buffer shared by the threads. The check must catch both, and pass the
correct one."""

import threading
import time

import pytest
import torch
import torch.nn.functional as F

from eml.common.cpp_checks import assert_matches_torch_in_turns_and_on_two_threads


class CorrectModule:
    """y = x W^T + b and its three gradients, with W^T "packed" into a buffer first, as the stages
    pack it; pack() hands out the buffer. Here a fresh one per call: nothing to go wrong."""

    def pack(self, weight):
        return weight.t().contiguous()

    def forward(self, input, weight, bias):
        return F.linear(input, weight, bias)

    def backward(self, grad_output, input, weight, need_input, need_weight, need_bias):
        n = input.numel() // input.shape[-1]
        grad_2d, input_2d = grad_output.reshape(n, -1), input.reshape(n, -1)
        packed = self.pack(weight)  # (in, out): grad_input = grad_output W = grad_output packed^T
        return [grad_output @ packed.t(), grad_2d.t() @ input_2d, grad_2d.sum(0)]


class NeverGrows(CorrectModule):
    """A buffer per thread, as it should be, but one that keeps the bytes of the first pack the
    thread made and packs every later weight into them, whatever it needs (a memory overrun in
    C++; here the pack is cut short, the rest read as zeros)."""

    def __init__(self):
        self.per_thread = threading.local()

    def pack(self, weight):
        flat = weight.t().contiguous().flatten()
        if not hasattr(self.per_thread, "bytes"):
            self.per_thread.bytes = flat.numel() * flat.element_size()
        fitted = torch.zeros_like(flat)
        count = min(flat.numel(), self.per_thread.bytes // flat.element_size())
        fitted[:count] = flat[:count]
        return fitted.reshape(weight.shape[1], weight.shape[0])


class SharedByThreads(CorrectModule):
    """A buffer that grows, but one for the whole process instead of one per thread: a thread
    packs into it, and while it computes from it (the sleep, which lets the other thread run, as
    the kernels would) the other thread packs its own weight over it."""

    def __init__(self):
        self.buffer = [None]

    def pack(self, weight):
        self.buffer[0] = weight.t().contiguous()
        time.sleep(0.001)
        return self.buffer[0].clone()


def test_the_correct_module_passes():
    assert_matches_torch_in_turns_and_on_two_threads(CorrectModule())


@pytest.mark.parametrize("broken, reason", [
    (NeverGrows, r"not close"),  # a big layer reads what a small one left: wrong values
    # the other thread's pack in place of this one's: wrong values, or the wrong dtype or shape
    (SharedByThreads, r"not close|same dtype|size|shape"),
], ids=["NeverGrows", "SharedByThreads"])
def test_a_broken_scratch_is_caught(broken, reason):
    with pytest.raises(AssertionError, match=rf"^layers in turn on two threads: .*({reason})"):
        assert_matches_torch_in_turns_and_on_two_threads(broken())
