"""The timing protocol without a GPU: contenders sampled in rounds of rotating order; the TF32 cuBLAS contender."""

import torch

from mla_lab import bench, check
from mla_lab.problem import Shape, make_inputs, reference


def test_interleaved_rounds_spread_a_clock_drift_over_every_contender(monkeypatch):
    """On a GPU whose clock drifts during the run (each sample 0.1 % slower than the one before,
    20 % over the run), two contenders of the same cost come out with the same median: timed one
    after the other, the second would read about 10 % slower; in rounds without rotation, 1 %."""
    samples_so_far = []

    def drifting_events_us(run, repeats, busy_first=False):
        run()
        samples_so_far.append(run)
        return 100.0 * (1 + 0.001 * len(samples_so_far))

    monkeypatch.setattr(bench, "_events_us", drifting_events_us)
    timers = {name: bench.Timer(run=lambda: None, calls=1, samples=100) for name in ("first", "second")}
    timings = {t.name: t for t in bench.sample(timers, "graph")}
    assert {t.samples for t in timings.values()} == {100}
    assert len(samples_so_far) == 200
    assert abs(timings["first"].median_us / timings["second"].median_us - 1) < 0.003


def test_every_contender_takes_a_share_of_its_samples_in_every_round(monkeypatch):
    order = []

    def recording_events_us(run, repeats, busy_first=False):
        run()
        return 1.0

    monkeypatch.setattr(bench, "_events_us", recording_events_us)
    timers = {name: bench.Timer(run=lambda name=name: order.append(name), calls=2, samples=samples)
              for name, samples in (("a", 10), ("b", 25), ("c", 13))}
    timings = bench.sample(timers, "stream", flops=2_000_000)
    assert [t.samples for t in timings] == [10, 25, 13]
    assert [t.median_us for t in timings] == [0.5, 0.5, 0.5]  # per call: each sample makes 2
    rounds, current = [], []
    for name in order:  # a round ends where a name comes back that it already visited
        if current and name != current[-1] and name in current:
            rounds.append(current)
            current = []
        current.append(name)
    rounds.append(current)
    firsts = [r[0] for r in rounds]
    assert len(rounds) == bench.ROUNDS and set(firsts) == {"a", "b", "c"}


def test_nothing_to_sample_gives_no_timings():
    assert bench.sample({}, "graph") == []


def test_graph_samples_start_behind_a_busy_gpu_and_stream_samples_do_not(monkeypatch):
    """Graph mode times device work: each sample waits behind a sleep kernel, so the CPU's
    submission of the graph is not timed. Stream mode times what a Python loop sees, launches
    included: no sleep there."""
    asked = []

    def events_us(run, repeats, busy_first=False):
        asked.append(busy_first)
        return 1.0

    monkeypatch.setattr(bench, "_events_us", events_us)
    timers = {"a": bench.Timer(run=lambda: None, calls=1, samples=10)}
    bench.sample(timers, "graph")
    assert asked == [True] * 10
    asked.clear()
    bench.sample(timers, "stream")
    assert asked == [False] * 10


def test_the_tf32_cublas_contender_concatenates_again_for_new_or_changed_weights():
    # It keeps its concatenation of [w_up_k | w_up_v] between calls. Keyed by address, it once
    # served a freed pair's concatenation to a new pair at the same addresses.
    shape = Shape(1, 3, 16, 8, 2, 4)
    contender = bench.CublasConcatTf32()
    for seed in range(3):
        inputs = make_inputs(shape, torch.float32, seed=seed)
        for _ in range(2):
            out = torch.full(shape.out_shape, float("nan"))
            contender(*inputs, shape.heads, out=out)
            assert check.compare(out, reference(*inputs, shape.heads).double(), torch.float32, shape).ok
            inputs.w_up_v.mul_(-2.0)  # changed in place: the next call must see it
        del inputs  # its addresses are free for the next seed's weights


def test_the_tf32_cublas_contender_is_handed_an_out_fills_it_and_restores_the_setting():
    # compare() calls a kernel that does not say it writes into an out without one; this one needs one
    # (a lab once stopped on that), and it must leave torch's global TF32 setting as it found it.
    shape = Shape(1, 3, 16, 8, 2, 4)
    inputs = make_inputs(shape, torch.float32)
    out = torch.full(shape.out_shape, float("nan"))
    contender = bench.CublasConcatTf32()
    assert check.accepts_out(contender) and check.tolerance(contender, torch.float32) == check.TF32_TOLERANCE
    before = torch.backends.cuda.matmul.allow_tf32
    assert contender(*inputs, shape.heads, out=out) is out
    assert torch.backends.cuda.matmul.allow_tf32 == before
    assert check.compare(out, reference(*inputs, shape.heads).double(), torch.float32, shape).ok
