"""A small sequence task for the LLTM stages: the cell unrolled over T = 100 steps.

Made here, no download: each sequence is T steps of ``features`` Gaussian inputs, and the
target at step t is a squashed running sum of the first input channel,

    y_t = tanh(0.25 * (x_1[0] + x_2[0] + ... + x_t[0]))

so the cell must integrate one channel over time and forget the others; the LLTM's cell state
(new_cell = old_cell + candidate * input_gate, no forget gate) suits it. A linear read-out
maps h_t to the prediction; the loss is the mean squared error over every step.

    from eml.common import lltm_sequence
    losses, seconds = lltm_sequence.train(eml.lltm_python.LLTM, steps=200)

The notebooks train each stage's cell with the same seed and compare the loss curves with
stage 09's; the stage tests run a handful of steps in float64 (see lltm_checks).
"""

from __future__ import annotations

import time

import torch


def make_task(steps=100, batch=32, features=4, seed=0, dtype=torch.float32, device="cpu"):
    """(inputs (T, B, F), targets (T, B, 1)) of the running-sum task."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(steps, batch, features, generator=generator, dtype=dtype)
    targets = torch.tanh(0.25 * inputs[..., :1].cumsum(dim=0))
    return inputs.to(device), targets.to(device)


class SequenceModel(torch.nn.Module):
    """A cell run over every step of a sequence, and a linear read-out of each h_t."""

    def __init__(self, cell, state_size):
        super().__init__()
        self.cell = cell
        self.state_size = state_size
        self.readout = torch.nn.Linear(state_size, 1)

    def forward(self, inputs):
        steps, batch = inputs.shape[:2]
        h = inputs.new_zeros(batch, self.state_size)
        c = inputs.new_zeros(batch, self.state_size)
        outputs = []
        for t in range(steps):
            h, c = self.cell(inputs[t], (h, c))
            outputs.append(self.readout(h))
        return torch.stack(outputs)


def train(make_cell, steps=300, sequence_length=100, batch=32, features=4, state_size=32,
          seed=0, dtype=torch.float32, lr=1e-2, device="cpu"):
    """Train a fresh cell make_cell(features, state_size) with Adam; (losses, seconds).

    Two correct cells that round differently follow one loss curve only for the first steps:
    the 100-step unrolled recurrence and the training loop amplify their rounding differences
    (measured in float64, stage 09 against 10: 4e-9 apart after 10 steps, 1e-6 after 12,
    1e-3 after 22; SGD with momentum parts the same way). Compare the first steps tightly and
    the end of training loosely.

    The parameters come from torch.manual_seed(seed), so two stages that initialise their
    cells alike (09, 10 and 11 do) start from the same weights and should follow one curve."""
    torch.manual_seed(seed)
    model = SequenceModel(make_cell(features, state_size), state_size).to(device=device, dtype=dtype)
    inputs, targets = make_task(sequence_length, batch, features, seed, dtype, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - start
