"""timing.timed_blocks runs a slow call once per round and times a fast one in blocks, and
timing.interleaved times a call over ONE_ROUND_S in the first round only.

blocked_autorange runs a statement once to size its blocks and again to time them; for a call
that alone outlasts min_run_time (seconds, for the textbook loops at the tour's large shapes)
that is twice the time for one value. The tests count the calls: no clock is judged.
"""

import time

import torch

from eml.common import timing


def counting(seconds=0.0):
    calls = []

    def call():
        calls.append(None)
        if seconds:
            time.sleep(seconds)
    return call, calls


def test_a_call_longer_than_min_run_time_runs_once_and_is_the_value():
    call, calls = counting(seconds=0.05)
    times = timing.timed_blocks(call, min_run_time=0.01, num_threads=torch.get_num_threads())
    assert len(calls) == 1
    assert len(times) == 1 and times[0] >= 0.05


def test_a_fast_call_is_warmed_up_then_timed_in_blocks():
    call, calls = counting()
    times = timing.timed_blocks(call, min_run_time=0.01, num_threads=torch.get_num_threads())
    assert len(calls) > 2  # the warm-up, blocked_autorange's sizing run, and blocks of many calls
    assert times and all(t < 0.01 for t in times)  # seconds per call, not per block


def test_the_calls_run_on_the_threads_asked_for():
    threads = []
    before = torch.get_num_threads()
    timing.timed_blocks(lambda: threads.append(torch.get_num_threads()), min_run_time=0.001, num_threads=1)
    assert set(threads) == {1}
    assert torch.get_num_threads() == before


def test_a_call_over_one_round_s_is_timed_in_the_first_round_only(monkeypatch):
    monkeypatch.setattr(timing, "ONE_ROUND_S", 0.02)
    slow, slow_calls = counting(seconds=0.03)
    medium, medium_calls = counting(seconds=0.011)  # over min_run_time (one call per block), under ONE_ROUND_S
    times = timing.interleaved({"slow": slow, "medium": medium}, rounds=3, min_run_time=0.01, num_threads=1)
    assert len(slow_calls) == 1 and len(times["slow"]) == 1
    assert len(medium_calls) == 3 and len(times["medium"]) == 3


def test_a_single_value_has_no_spread_and_the_table_says_so():
    row = timing.Timing("slow", (3, 5, 7), 10.0, None, 30.0, 0.25)
    table = timing.format_table([row], "slow")
    assert table.splitlines()[-1].split()[2:6] == ["10.0", "-", "30.0", "25"]


def test_time_layers_gives_every_layer_both_timings():
    makers = {"nn.Linear": torch.nn.Linear, "slow": lambda i, o: SlowLinear(i, o)}
    results = timing.time_layers(makers, (3, 5, 7), rounds=2, min_run_time=0.001)
    assert [r.label for r in results] == ["nn.Linear", "slow"]
    slow = results[1]
    # SlowLinear sleeps 5 ms per forward: one call per block, two rounds, so two values of at least that
    assert slow.forward_us >= 5e3 and slow.training_us >= 5e3


class SlowLinear(torch.nn.Linear):
    def forward(self, x):
        time.sleep(0.005)
        return super().forward(x)
