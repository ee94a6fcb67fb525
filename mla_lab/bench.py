"""Timing: CUDA events, warm-up, median of many repeats, in two modes.

  graph   the calls are captured in a CUDA graph and the graph is replayed: device time, without
          the ~5 us per launch that Python adds. The honest number for launch-bound sizes.
  stream  plain calls from Python on the current stream: what a Python loop sees.

Everything compared is timed in one process on the same inputs, beside the eager reference and
the cuBLAS peer (two GEMMs, the second writing the stacked output through the concatenated
weights of notebook 02).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from . import check, layout
from .problem import Inputs, Shape, make_inputs, oracle, reference

MODES = ("graph", "stream")


@dataclass
class Timing:
    name: str
    mode: str
    median_us: float
    low_us: float  # 10th percentile of the samples
    high_us: float  # 90th percentile
    samples: int
    flops: int

    @property
    def tflops(self) -> float:
        return self.flops / (self.median_us * 1e-6) / 1e12


def _events_us(run: Callable[[], None], repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / repeats


def time_fn(
    fn: Callable[[], object] | Sequence[Callable[[], object]],
    mode: str = "graph",
    name: str = "",
    flops: int = 0,
    target_sample_us: float = 200.0,
    budget_s: float = 0.4,
) -> Timing:
    """Median microseconds per call of fn() (no arguments; it must run on the current stream).

    Given several callables (the same call on different input sets), calls cycle through them,
    so that for sizes near the L2 cache each call finds its inputs evicted, as in a model.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    fns = [fn] if callable(fn) else list(fn)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, off the default stream as graph capture requires
        for _ in range(2):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(side)
    estimate = _events_us(lambda: [f() for f in fns], 2) / len(fns)
    calls = max(1, min(64, math.ceil(target_sample_us / max(estimate, 1e-3))))
    calls = math.ceil(calls / len(fns)) * len(fns)
    order = [fns[i % len(fns)] for i in range(calls)]
    if mode == "graph":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for f in order:
                f()
        run = graph.replay
    else:
        def run() -> None:
            for f in order:
                f()

    run()
    samples = max(10, min(200, int(budget_s * 1e6 / max(estimate * calls, 1e-3))))
    times = sorted(_events_us(run, 1) / calls for _ in range(samples))
    decile = max(1, samples // 10)
    return Timing(
        name, mode, statistics.median(times), times[decile - 1], times[-decile], samples, flops
    )


def peers(inputs: Inputs, heads: int) -> dict[str, Callable[[], object]]:
    """The eager reference and the cuBLAS concatenated-weights projection, ready to time."""
    w_cat = layout.concat_weights(inputs.w_up_k, inputs.w_up_v)
    shape_out = (*inputs.hidden.shape[:2], 2, heads, inputs.w_up_k.shape[1] // heads)
    out = torch.empty(shape_out, dtype=inputs.hidden.dtype, device=inputs.hidden.device)
    return {
        "eager": lambda: reference(*inputs, heads),
        "cuBLAS concat": lambda: layout.concat_projection(
            inputs.hidden, inputs.w_down, w_cat, heads, out
        ),
    }


def compare(
    kernels: dict[str, Callable],
    shape: Shape,
    dtype: torch.dtype = torch.float32,
    mode: str = "graph",
    with_peers: bool = True,
    seed: int = 0,
) -> list[Timing]:
    """Time each kernel (called like the reference) and the peers on one set of inputs.

    Each kernel's output on these inputs is checked against float64 first: a wrong kernel raises
    instead of producing a number.
    """
    inputs = make_inputs(shape, dtype, "cuda", seed)
    expected = oracle(inputs, shape.heads) if kernels else None
    calls: dict[str, Callable[[], object]] = {}
    for name, kernel in kernels.items():
        verdict = check.compare(
            kernel(*inputs, shape.heads), expected, dtype, shape, check.tolerance(kernel, dtype)
        )
        if not verdict.ok:
            raise AssertionError(f"{name} is wrong on {shape.label()}: {verdict.problem}")
        out = torch.empty(shape.out_shape, dtype=dtype, device="cuda")
        if check.accepts_out(kernel):
            calls[name] = lambda kernel=kernel, out=out: kernel(*inputs, shape.heads, out=out)
        else:
            calls[name] = lambda kernel=kernel: kernel(*inputs, shape.heads)
    if with_peers:
        calls.update(peers(inputs, shape.heads))
    return [time_fn(fn, mode, name, shape.flops()) for name, fn in calls.items()]


def table(timings: list[Timing], baseline: str = "eager") -> str:
    """A fixed-width table: name, median, spread, TFLOP/s, speed-up over the baseline."""
    base = next((t.median_us for t in timings if t.name == baseline), None)
    width = max([16, *(len(t.name) for t in timings)])
    lines = [f"{'':{width}} {'median us':>10} {'p10-p90 us':>15} {'TFLOP/s':>8} {'vs ' + baseline:>10}"]
    for t in timings:
        speedup = f"{base / t.median_us:9.2f}x" if base else ""
        spread = f"{t.low_us:.1f}-{t.high_us:.1f}"
        lines.append(f"{t.name:{width}} {t.median_us:10.1f} {spread:>15} {t.tflops:8.2f} {speedup:>10}")
    return "\n".join(lines)


def measure_ceilings() -> dict[str, float]:
    """This GPU's own ceilings: large matmuls (TFLOP/s) and a large copy (TB/s, read + write)."""
    rates = {}
    n = 8192
    kinds = (
        ("bf16 matmul", torch.bfloat16, False),
        ("fp32 matmul", torch.float32, False),
        ("tf32 matmul", torch.float32, True),
    )
    for name, dtype, tf32 in kinds:
        a = torch.randn(n, n, device="cuda").to(dtype)
        b = torch.randn(n, n, device="cuda").to(dtype)
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            timing = time_fn(lambda: a @ b, "stream", name, 2 * n**3)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        rates[f"{name} TFLOP/s"] = timing.tflops
    source = torch.randn(2**28, device="cuda")  # 1 GiB, far beyond L2
    target = torch.empty_like(source)
    copy = time_fn(lambda: target.copy_(source), "stream", "copy")
    rates["copy TB/s"] = 2 * source.numel() * 4 / (copy.median_us * 1e-6) / 1e12
    return rates


def device_line() -> str:
    """Which GPU and software produced a measurement (printed beside every GPU result)."""
    props = torch.cuda.get_device_properties(0)
    return (
        f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs), "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
