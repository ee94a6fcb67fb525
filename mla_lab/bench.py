"""Timing: CUDA events, warm-up, median of many repeats, in two modes.

  graph   the calls are captured in a CUDA graph and the graph is replayed: device time, without
          the ~5 us per launch that Python adds. The honest number for launch-bound sizes.
          Each replay is queued behind a short sleep kernel, so the events time the GPU running
          the graph, not the CPU submitting it or the GPU waking up.
  stream  plain calls from Python on the current stream: what a Python loop sees.

Everything compared is timed in one process on the same inputs, beside the eager reference and
the cuBLAS peer (two GEMMs, the second writing the stacked output through the concatenated
weights of notebook 02).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from . import check, layout, steps
from .problem import Inputs, Shape, make_inputs, oracle, reference

MODES = ("graph", "stream")
SAMPLE_US = 500.0  # one timed sample makes enough calls to last about this long (at most 64):
# a graph replay costs 5-10 µs more than its calls (measured on the H200), 1-2 % of that
# Timed one after the other in one process, the contender timed first ran up to 9 % faster than
# the same kernel timed later (measured on the H200). So samples are taken in rounds, each
# visiting every contender, the order rotated from round to round: a drift of the GPU's clocks
# during the run falls on all contenders alike.
ROUNDS = 10
# In graph mode a sample starts behind a sleep kernel of this many GPU cycles (about 100 µs at
# the H200's 1.98 GHz): the start event is taken when the GPU reaches it, with the graph already
# submitted behind it. Sampled from an idle GPU, the events also counted the graph's submission
# or the GPU's wake-up (not told apart): on the H200 a graph of empty kernels read 2.5 µs per call
# where they run in 0.55, and eager's toy 27.8 µs where it runs in 20.6.
BUSY_CYCLES = 200_000


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


def _events_us(run: Callable[[], None], repeats: int, busy_first: bool = False) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if busy_first:
        torch.cuda._sleep(BUSY_CYCLES)
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / repeats


@dataclass
class Timer:
    """One contender ready to sample: warmed up and, in graph mode, captured.

    One sample runs `run` once, which makes `calls` calls; `samples` is how many to take in all.
    """
    run: Callable[[], None]
    calls: int
    samples: int


def prepare(
    fn: Callable[[], object] | Sequence[Callable[[], object]],
    mode: str = "graph",
    budget_s: float = 0.4,
) -> Timer:
    """Warm fn() up (no arguments; it must run on the current stream) and capture it for timing.

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
    # graph mode: the calls' device time (the CPU's launches hidden behind a sleep); stream mode:
    # the time a Python loop takes, launches included
    estimate = _events_us(lambda: [f() for f in fns], 2, busy_first=mode == "graph") / len(fns)
    calls = max(1, min(64, math.ceil(SAMPLE_US / max(estimate, 1e-3))))
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
    samples = max(ROUNDS, min(200, int(budget_s * 1e6 / max(estimate * calls, 1e-3))))
    return Timer(run, calls, samples)


def sample(timers: dict[str, Timer], mode: str, flops: int = 0) -> list[Timing]:
    """Median microseconds per call of each prepared contender, sampled in interleaved rounds."""
    names = list(timers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(ROUNDS if names else 0):
        for name in names[r % len(names):] + names[:r % len(names)]:
            timer = timers[name]
            share = timer.samples * (r + 1) // ROUNDS - timer.samples * r // ROUNDS
            times[name] += [_events_us(timer.run, 1, busy_first=mode == "graph") / timer.calls for _ in range(share)]
    timings = []
    for name in names:
        ordered = sorted(times[name])
        decile = max(1, len(ordered) // 10)
        timings.append(Timing(name, mode, statistics.median(ordered), ordered[decile - 1], ordered[-decile],
                              len(ordered), flops))
    return timings


def time_many(
    contenders: dict[str, Callable[[], object] | Sequence[Callable[[], object]]],
    mode: str = "graph",
    flops: int = 0,
    budget_s: float = 0.4,
) -> list[Timing]:
    """Time several calls of the same work against each other (see `prepare` and `sample`)."""
    timers = {name: prepare(fn, mode, budget_s=budget_s) for name, fn in contenders.items()}
    return sample(timers, mode, flops)


def time_fn(
    fn: Callable[[], object] | Sequence[Callable[[], object]],
    mode: str = "graph",
    name: str = "",
    flops: int = 0,
    budget_s: float = 0.4,
) -> Timing:
    """Median microseconds per call of fn() alone (see `prepare`)."""
    return time_many({name: fn}, mode, flops, budget_s)[0]


PEERS = ("eager", "cuBLAS concat", "cuBLAS concat TF32", "torch.compile")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the names results are recorded under


def dtype_label(dtype: torch.dtype) -> str:
    """"fp32" or "bf16": a dtype's name in results and one-line reports."""
    return next(name for name, d in DTYPES.items() if d == dtype)
NOTEBOOK_PEERS = ("eager", "cuBLAS concat")


def peer_calls(inputs: Inputs, heads: int, out: torch.Tensor, compiled: Callable | None = None) -> dict[str, Callable]:
    """The peers, ready to time on these inputs: the eager reference, cuBLAS through the
    concatenated weights of notebook 02 (writing into `out`; with TF32 allowed too, for fp32),
    and, given the compiled reference, torch.compile."""
    w_cat = layout.concat_weights(inputs.w_up_k, inputs.w_up_v)

    def cublas(tf32: bool) -> Callable[[], torch.Tensor]:
        return lambda: layout.concat_projection(inputs.hidden, inputs.w_down, w_cat, heads, out, allow_tf32=tf32)

    calls = {"eager": lambda: reference(*inputs, heads), "cuBLAS concat": cublas(False)}
    if inputs.hidden.dtype == torch.float32:
        calls["cuBLAS concat TF32"] = cublas(True)
    if compiled is not None:
        calls["torch.compile"] = lambda: compiled(*inputs, heads)
    return calls


class CublasConcatTf32:
    """The "cuBLAS concat TF32" peer as a kernel for `compare`: two cuBLAS GEMMs with TF32
    allowed, through [w_up_k | w_up_v] concatenated once per pair of weights (outside the timing,
    as `peer_calls` does). Checked at TF32's tolerance, and handed a NaN-poisoned `out` as the
    course's kernels are."""

    fp32_math = "tf32"
    writes_into_out = True

    def __init__(self) -> None:
        self._last: tuple = ()  # (w_up_k, w_up_v, their versions, the concatenation)

    def __call__(self, hidden, w_down, w_up_k, w_up_v, heads, out):
        # Held by identity, not by address: the last pair stays alive, so a new pair never takes its
        # addresses and hits a stale concatenation (keyed by data_ptr, it served a stale one).
        versions = (w_up_k._version, w_up_v._version)
        fresh = bool(self._last) and self._last[0] is w_up_k and self._last[1] is w_up_v and self._last[2] == versions
        if not fresh:
            self._last = (w_up_k, w_up_v, versions, layout.concat_weights(w_up_k, w_up_v))
        return layout.concat_projection(hidden, w_down, self._last[3], heads, out, allow_tf32=True)


@dataclass
class Result:
    name: str  # "step 5 (tensor_cores)" or a peer
    shape: str  # a name for the shape (a key of mla_lab.sweep.SHAPES, or its label)
    tokens: int
    dtype: str
    mode: str
    status: str  # "ok", "wrong", "skipped" or "failed"
    note: str = ""
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    samples: int = 0
    rel_error: float | None = None
    tflops: float | None = None
    gbps: float | None = None  # minimum bytes (mla_lab.problem.Shape.min_bytes) per second
    floor_us: float | None = None  # max(FLOPs / peak, min bytes / copy bandwidth)
    of_floor: float | None = None  # floor_us / median_us: 1.0 is the roofline
    prepare_us: float | None = None  # a contender with prepared weights: preparing them once (stream mode)


def input_sets(shape: Shape, dtype: torch.dtype, seed: int) -> list[Inputs]:
    """Enough input sets that cycling through them evicts the previous call's data from L2."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20) or 50 * 2**20
    count = max(1, min(4, math.ceil(3 * l2 / max(shape.min_bytes(dtype), 1))))
    return [make_inputs(shape, dtype, "cuda", seed + i) for i in range(count)]


def floor_us(shape: Shape, dtype: torch.dtype, ceilings: dict[str, float], tensor_passes: int) -> float:
    """The roofline floor; fp32 inputs taken in `tensor_passes` TF32 passes do that many times the
    tensor work at the TF32 rate (0: FFMA at the fp32 rate)."""
    if dtype == torch.bfloat16:
        compute = shape.flops() / (ceilings["bf16 matmul TFLOP/s"] * 1e12)
    elif tensor_passes:
        compute = tensor_passes * shape.flops() / (ceilings["tf32 matmul TFLOP/s"] * 1e12)
    else:
        compute = shape.flops() / (ceilings["fp32 matmul TFLOP/s"] * 1e12)
    memory = shape.min_bytes(dtype) / (ceilings["copy TB/s"] * 1e12)
    return max(compute, memory) * 1e6


def _error_note(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


def measure(
    kernels: dict[str, Callable],
    shape: Shape,
    dtype: torch.dtype,
    peers: Iterable[str] = NOTEBOOK_PEERS,
    modes: Iterable[str] = ("graph",),
    seed: int = 0,
    budget_s: float = 0.4,
    rotate_inputs: bool = False,
    ceilings: dict[str, float] | None = None,
    compiled: Callable | None = None,
    shape_name: str = "",
    checked: bool = True,
) -> list[Result]:
    """Check, then time, kernels and peers on the same inputs: the one routine behind the
    notebooks' `compare` and the sweep.

    Each contender's output is written into a NaN-poisoned tensor (where it takes `out=`) and
    checked against float64; a contender that raises is "failed", a wrong one "wrong"; the correct
    ones are timed against each other in interleaved rounds in each mode, then checked again (an
    output that changed while it was timed is wrong). With `rotate_inputs`, calls cycle through
    enough input sets that the L2 cannot serve them; with `ceilings`, each result carries its
    roofline floor. Unchecked (`checked=False`), every contender is timed and none is compared:
    for probes, copies of a step cut short on purpose, whose outputs are wrong.
    """
    dtype_name = dtype_label(dtype)
    shape_name = shape_name or shape.label()
    modes = list(modes)
    sets = input_sets(shape, dtype, seed) if rotate_inputs else [make_inputs(shape, dtype, "cuda", seed)]
    expected = oracle(sets[0], shape.heads) if checked else None
    outs = [torch.full(shape.out_shape, float("nan"), dtype=dtype, device="cuda") for _ in sets]
    contenders: dict[str, tuple[object, list[Callable[[], object]]]] = {}
    prepare_us: dict[str, float] = {}
    for name, kernel in kernels.items():
        if isinstance(kernel, steps.Prepared):  # the weights of each input set prepared once, untimed
            prepared = [kernel.prepare(i.w_down, i.w_up_k, i.w_up_v, shape.heads) for i in sets]
            calls = [lambda kernel=kernel, i=i, o=o, p=p: kernel(*i, shape.heads, out=o, prepared=p)
                     for i, o, p in zip(sets, outs, prepared)]
            weights = (sets[0].w_down, sets[0].w_up_k, sets[0].w_up_v, shape.heads)
            prepare_us[name] = time_fn(lambda kernel=kernel: kernel.prepare(*weights), "stream",
                                       budget_s=budget_s).median_us
        elif check.accepts_out(kernel):
            calls = [lambda kernel=kernel, i=i, o=o: kernel(*i, shape.heads, out=o) for i, o in zip(sets, outs)]
        else:
            calls = [lambda kernel=kernel, i=i: kernel(*i, shape.heads) for i in sets]
        contenders[name] = (kernel, calls)
    peer_sets = [peer_calls(i, shape.heads, o, compiled) for i, o in zip(sets, outs)]
    for name in peers:
        if name in peer_sets[0]:  # "cuBLAS concat TF32" exists for fp32 only, "torch.compile" once compiled
            contenders[name] = (CublasConcatTf32() if name == "cuBLAS concat TF32" else None,
                                [calls[name] for calls in peer_sets])

    results: list[Result] = []

    def record(name: str, status: str, note: str = "", mode: str | None = None, **values) -> None:
        for m in [mode] if mode else modes:
            results.append(Result(name, shape_name, shape.tokens, dtype_name, m, status, note, **values))

    def verdict_of(name: str) -> check.Verdict:
        kernel, calls = contenders[name]
        got = calls[0]()
        torch.cuda.synchronize()
        return check.compare(got, expected, dtype, shape, check.tolerance(kernel, dtype))

    correct: dict[str, check.Verdict | None] = {}  # the contenders to time; a probe's have no verdict
    for name in contenders:
        if not checked:
            correct[name] = None
            continue
        try:
            verdict = verdict_of(name)
        except Exception as error:  # a contender that cannot run here is recorded, not fatal
            record(name, "failed", _error_note(error))
            continue
        if verdict.ok:
            correct[name] = verdict
        else:
            record(name, "wrong", verdict.problem, rel_error=verdict.rel_error)
    for mode in modes:
        timers = {}
        for name in correct:
            try:
                timers[name] = prepare(contenders[name][1], mode, budget_s=budget_s)
            except Exception as error:
                record(name, "failed", _error_note(error), mode)
        for timing in sample(timers, mode, shape.flops()):
            kernel = contenders[timing.name][0]
            passes = getattr(getattr(kernel, "step", kernel), "fp32_tensor_passes", 0)
            if timing.name == "cuBLAS concat TF32":
                passes = 1
            floor = floor_us(shape, dtype, ceilings, passes) if ceilings else None
            record(timing.name, "ok", mode=mode, median_us=timing.median_us, p10_us=timing.low_us,
                   p90_us=timing.high_us, samples=timing.samples,
                   rel_error=getattr(correct[timing.name], "rel_error", None),
                   tflops=timing.tflops, gbps=shape.min_bytes(dtype) / (timing.median_us * 1e-6) / 1e9,
                   floor_us=floor, of_floor=floor / timing.median_us if floor else None,
                   prepare_us=prepare_us.get(timing.name))
        del timers
    for name in (name for name, verdict in correct.items() if verdict is not None):
        after = verdict_of(name)
        if not after.ok:
            for r in results:
                if r.name == name:
                    r.status, r.note = "wrong", f"after timing: {after.problem}"
    return results


def compare(
    kernels: dict[str, Callable],
    shape: Shape,
    dtype: torch.dtype = torch.float32,
    mode: str = "graph",
    with_peers: bool = True,
    seed: int = 0,
    rotate_inputs: bool = False,
    checked: bool = True,
) -> list[Timing]:
    """Time each kernel (called like the reference) and the peers on the same inputs, against
    each other in interleaved rounds, after checking each against float64 (`measure`): a wrong
    or failing kernel raises instead of producing a number (unchecked, only a failing one)."""
    results = measure(kernels, shape, dtype, NOTEBOOK_PEERS if with_peers else (), (mode,), seed,
                      rotate_inputs=rotate_inputs, checked=checked)
    for r in results:
        if r.status != "ok":
            raise AssertionError(f"{r.name} is {r.status} on {shape.label()}: {r.note}")
    return [Timing(r.name, mode, r.median_us, r.p10_us, r.p90_us, r.samples, shape.flops()) for r in results]


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
