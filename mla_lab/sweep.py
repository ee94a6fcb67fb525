"""The benchmark suite: every step and peer over the toy to DeepSeek-V3, recorded as JSON.

`python -m mla_lab bench` (or `make bench`) runs it on a GPU: for each shape and dtype it makes
one set of inputs (several, rotated, where they fit the L2 cache), checks every contender against
the float64 oracle on them, times the correct ones in graph and stream mode (mla_lab.bench), and
writes results/<device>.json with the device, software, date, command and the ceilings measured
in the same run. Plots (mla_lab.plots) and the README table (`python -m mla_lab results`) are
made from that file and nothing else, so they cannot drift from the data.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import bench, dispatch, fingerprint, steps
from .problem import TOY, V2_LITE, V3, V3_TP8, Shape, make_inputs, reference

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "results"

# Named sweep points: the toy, V2-Lite from a single decode token to 8192-token prefill, and V3
# (the 16-head tensor-parallel slice and all 128 heads) from decode batches to 16384 tokens; odd
# token counts between the powers of two, where no tile divides the tokens.
SHAPES: dict[str, Shape] = {
    "toy": TOY,
    **{f"v2_lite@{n}": V2_LITE.with_tokens(1, n) for n in (1, 5, 16, 64, 128, 256, 512, 1000, 2048, 4096, 8192)},
    **{f"v3_tp8@{n}": V3_TP8.with_tokens(1, n) for n in (1, 64, 300, 4096)},
    **{f"v3@{n}": V3.with_tokens(1, n) for n in (64, 1000, 4096, 16384)},
}
DTYPES = bench.DTYPES
PEERS = bench.PEERS
PREPARED_SUFFIX = " prepared"  # a contender given its weights prepared once, outside the timing


def ways_to_call(label: str, kernel: steps.Kernel, prepared: bool = True) -> dict[str, object]:
    """The kernel as a contender under `label`, and, for a step with a layout of its own (unless
    `prepared` is False), a second one under `label` + PREPARED_SUFFIX, given its weights prepared
    once: as an inference engine calls it."""
    ways: dict[str, object] = {label: kernel}
    if prepared and kernel.prepares_weights:
        ways[label + PREPARED_SUFFIX] = steps.Prepared(kernel, kernel.prepare)
    return ways


def point(name: str) -> tuple[str, Shape, str, torch.dtype]:
    """A sweep point named like "v2_lite@4096 bf16": its shape's name, the shape, the dtype's name, the dtype."""
    shape_name, dtype_name = name.split()
    return shape_name, SHAPES[shape_name], dtype_name, DTYPES[dtype_name]

# Steps 1, 2 and 7 do work that grows with tokens x weights; past these estimates a call takes so
# long that timing it would eat the sweep. Seconds per call from the multiply-adds a step does and
# the rate it sustained on the H200 (step 7's per dtype, at V2-Lite 8192 tokens in sweep
# 67313efa5032, before its threads took two columns each; the kernel has only got faster since).
SLOW_STEP_SECONDS = {
    1: lambda s, dtype: s.tokens * 2 * s.width * s.d_model * s.rank / 2.0e12,  # redundant FMAs
    2: lambda s, dtype: s.flops() / 2 / 3.0e12,  # useful FMAs, every weight re-read per token
    7: lambda s, dtype: s.flops() / 2 / {"fp32": 1.5e12, "bf16": 2.4e12}[dtype],  # useful FMAs
}
MAX_CALL_SECONDS = 0.02


Result = bench.Result


@dataclass
class Sweep:
    meta: dict
    results: list[Result] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"meta": self.meta, "results": [asdict(r) for r in self.results]}, indent=1)

    @classmethod
    def load(cls, path: str | Path) -> Sweep:
        data = json.loads(Path(path).read_text())
        return cls(data["meta"], [Result(**r) for r in data["results"]])

    def find(self, name: str, shape: str, dtype: str, mode: str = "graph") -> Result | None:
        for r in self.results:
            if (r.name, r.shape, r.dtype, r.mode) == (name, shape, dtype, mode):
                return r
        return None


def driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def git_commit() -> str:
    """HEAD, marked "-dirty" when tracked files differ from it (then `sources` is what counts)."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=REPO,
                             capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def sources_fingerprint() -> str:
    """One digest of the code that the numbers depend on (mla_lab.fingerprint), as this checkout has it."""
    return fingerprint.short(fingerprint.current())


def device_meta(command: str, ceilings: dict[str, float]) -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "device": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", 0),
        "driver": driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "git_commit": git_commit(),
        "sources": sources_fingerprint(),
        "fingerprint": fingerprint.current(),
        "ceilings": ceilings,
        "cublas": cublas_version(),
        "gpu_state": gpu_state(),
        "l2_policy": "inputs rotated through enough sets to exceed the L2 where one set fits in it "
                     "(mla_lab.bench.input_sets); spread per number: p10_us and p90_us",
    }


def cublas_version() -> str:
    """The cuBLAS that torch loaded, as major.minor.patch, or "unknown"."""
    import ctypes

    torch.cuda.current_blas_handle()  # loads cuBLAS if nothing has yet
    for name in (f"libcublas.so.{torch.version.cuda.split('.')[0]}", "libcublas.so"):
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        parts = []
        for kind in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            if library.cublasGetProperty(kind, ctypes.byref(value)) != 0:
                break
            parts.append(str(value.value))
        if len(parts) == 3:
            return ".".join(parts)
    return "unknown"


GPU_STATE_FIELDS = ("clocks.sm", "clocks.mem", "clocks.max.sm", "temperature.gpu", "power.draw", "power.limit",
                    "clocks_event_reasons.active")


def gpu_state() -> dict[str, str]:
    """Clocks, temperature and power when the sweep started (nvidia-smi), or {} where it cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(GPU_STATE_FIELDS)}", "--format=csv,noheader",
                              "-i", str(torch.cuda.current_device())], capture_output=True, text=True, timeout=30)
        values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")]
    except (OSError, IndexError, subprocess.SubprocessError):
        return {}
    return dict(zip(GPU_STATE_FIELDS, values)) if len(values) == len(GPU_STATE_FIELDS) else {}


def device_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200': the results file name."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower().removeprefix("nvidia").strip()).strip("_") or "gpu"


def run(
    step_keys: Iterable[int | str] | None = None,
    shape_names: Iterable[str] | None = None,
    dtype_names: Iterable[str] = ("fp32", "bf16"),
    modes: Iterable[str] = bench.MODES,
    peers: Iterable[str] = PEERS,
    command: str = "",
    budget_s: float = 0.25,
    progress: Callable[[str], None] | None = None,
    checkpoint: Path | None = None,
    resume: bool = False,
    stop_after_s: float | None = None,
) -> Sweep:
    """Check and time everything asked for on the current GPU; returns the whole record.

    With `checkpoint`, the record so far is written there after every point; with `resume` too, a
    checkpoint already there from the same GPU model, sources and plan (steps, shapes, dtypes,
    modes, peers) is taken up where it stopped: a sweep that a time limit cut short goes on in the
    next sitting. Each point is still measured whole in one process, its contenders beside each
    other; the record lists its sittings, each with its own date, ceilings, points and seconds a
    point. With `stop_after_s`, no point starts after that many seconds: the sitting ends with
    SweepCutShort, its points kept in the checkpoint, rather than under a time limit that kills a
    point half-done."""
    measured = plan(step_keys, shape_names, dtype_names, modes, peers)
    chosen_steps, chosen_shapes = [steps.get(n) for n in measured["steps"]], measured["shapes"]
    for name in chosen_shapes:
        if name not in SHAPES:
            raise ValueError(f"no sweep shape {name!r}; the shapes are {', '.join(SHAPES)}")
    modes, peers, dtype_names = measured["modes"], measured["peers"], measured["dtypes"]
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    started = time.monotonic()
    ceilings = bench.measure_ceilings()
    meta = device_meta(command, ceilings)
    # Each point's seconds (checks, captures, timing), beside its name: what a sitting can fit.
    sitting = {"date": meta["date"], "ceilings": ceilings, "gpu_state": meta.get("gpu_state", {}), "points": [],
               "seconds": []}
    sweep = _taken_up(checkpoint, meta, measured, say) if resume else None
    if sweep is None:
        sweep = Sweep({**meta, "sittings": []})
    sweep.meta["sittings"].append(sitting)
    done = {point for earlier in sweep.meta["sittings"] for point in earlier["points"]}
    kernels = {s.label: steps.load(s.number) for s in chosen_steps}
    compiled = torch.compile(reference, dynamic=True) if "torch.compile" in peers else None
    points = [(s, d) for s in chosen_shapes for d in dtype_names]
    for index, (shape_name, dtype_name) in enumerate(points, 1):
        if f"{shape_name} {dtype_name}" in done:
            continue
        point_started = time.monotonic()
        if stop_after_s is not None and point_started - started > stop_after_s:
            measured_now = len(done) + len(sitting["points"])
            raise SweepCutShort(f"stopped after {stop_after_s:.0f} s with {measured_now} of {len(points)} points "
                                f"measured, kept in {checkpoint}: run it again with --resume to go on")
        shape, dtype = SHAPES[shape_name], DTYPES[dtype_name]
        progress_bar = round(20 * (index - 1) / len(points))
        say(f"[{'#' * progress_bar}{'.' * (20 - progress_bar)}] {index}/{len(points)} {shape_name} {dtype_name}: "
            f"{shape.label()}")
        sweep.results += _measure_point(
            shape_name, shape, dtype_name, dtype, chosen_steps, kernels, peers, modes, compiled,
            ceilings, budget_s, seed=index,
        )
        sitting["points"].append(f"{shape_name} {dtype_name}")
        sitting["seconds"].append(round(time.monotonic() - point_started, 1))
        torch.cuda.empty_cache()
        if checkpoint is not None:
            _write_checkpoint(checkpoint, sweep, measured)
    sweep.meta["sittings"] = [s for s in sweep.meta["sittings"] if s["points"]]
    return sweep


class SweepCutShort(RuntimeError):
    """A sitting ended by its time budget between two points; the checkpoint holds the rest."""


def checkpoint_path_for(device: str, plan_of: dict) -> Path:
    """Where `python -m mla_lab bench` keeps a sweep in progress (git-ignored): one file per GPU
    model and plan, so that a sweep of a few points leaves a whole sweep's checkpoint alone."""
    digest = hashlib.sha256(json.dumps(plan_of, sort_keys=True).encode()).hexdigest()[:8]
    return REPO / "build" / "sweep" / f"{device_slug(device)}-{digest}.json"


def plan(step_keys: Iterable[int | str] | None = None, shape_names: Iterable[str] | None = None,
         dtype_names: Iterable[str] = tuple(DTYPES), modes: Iterable[str] = bench.MODES,
         peers: Iterable[str] = PEERS) -> dict:
    """What a sweep measures, as `run` records it in its checkpoint (by default, the whole sweep)."""
    chosen_steps = [steps.get(k) for k in step_keys] if step_keys else list(steps.STEPS)
    return {"steps": [s.number for s in chosen_steps], "shapes": list(shape_names) if shape_names else list(SHAPES),
            "dtypes": list(dtype_names), "modes": list(modes), "peers": list(peers)}


def whole_sweep_of_these_sources(device: str) -> Path | None:
    """results/<device>.json, where it holds a sweep of this checkout's sources (a resumed sweep
    that finished has nothing left to go on with)."""
    record = of_device(device)
    return sweep_path_for(record.meta) if record and record.meta["sources"] == sources_fingerprint() else None


def _write_checkpoint(path: Path, sweep: Sweep, measured: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".writing")  # a kill mid-write leaves the last whole checkpoint
    record = {"plan": measured, "meta": sweep.meta, "results": [asdict(r) for r in sweep.results]}
    partial.write_text(json.dumps(record))
    partial.replace(path)


def _taken_up(path: Path | None, meta: dict, measured: dict, say: Callable[[str], None]) -> Sweep | None:
    """The sweep in progress at `path`, if it can go on here: the same GPU model, sources and plan."""
    if path is None or not path.exists():
        return None
    data = json.loads(path.read_text())
    earlier = data["meta"]
    differs = [what for what, same in (("GPU model", earlier["device"] == meta["device"]),
                                       ("sources", earlier["sources"] == meta["sources"]),
                                       ("plan", data["plan"] == measured)) if not same]
    if differs:
        say(f"{path}: a sweep of another {' and '.join(differs)}; starting afresh")
        return None
    taken = Sweep(earlier, [Result(**r) for r in data["results"]])
    points = sum(len(s["points"]) for s in earlier["sittings"])
    say(f"{path}: going on from {points} points measured in {len(earlier['sittings'])} sitting(s)")
    return taken


def _measure_point(shape_name, shape, dtype_name, dtype, chosen_steps, kernels, peers, modes,
                   compiled, ceilings, budget_s, seed) -> list[Result]:
    """One sweep point: the steps that take it (the others recorded as skipped, with why), then
    `bench.measure` with every peer, the inputs rotated past the L2, and roofline floors."""
    skipped: list[Result] = []
    contenders = {}
    probe = make_inputs(shape, dtype, "cuda", seed)
    for step in chosen_steps:
        kernel = kernels[step.label]
        why = why_not_timed(step, kernel, shape, dtype_name, probe)
        if why is None:
            contenders |= ways_to_call(step.label, kernel)
        else:
            skipped += [Result(step.label, shape_name, shape.tokens, dtype_name, mode, "skipped", why) for mode in modes]
    chosen = {dispatch.NAME: dispatch.choose(*probe), dispatch.PREPARED_NAME: dispatch.choose(*probe, prepared=True)}
    if dispatch.has_layout_to_prepare(probe.w_down):
        contenders[dispatch.PREPARED_NAME] = steps.Prepared(dispatch.project, dispatch.prepare)
    del probe
    contenders[dispatch.NAME] = dispatch.project
    results = bench.measure(contenders, shape, dtype, peers, modes, seed, budget_s, rotate_inputs=True,
                            ceilings=ceilings, compiled=compiled, shape_name=shape_name)
    for r in results:
        if r.name in (dispatch.NAME, dispatch.PREPARED_NAME) and r.status == "ok":
            r.note = f"ran {steps.get(chosen[r.name]).label}"
    return skipped + results


def why_not_timed(step: steps.Step, kernel: steps.Kernel, shape: Shape, dtype_name: str, probe) -> str | None:
    """Why a step is left out at a point (too slow to time, past its limits, or its fallback's kernel
    would run), or None: the one rule for the sweep, `bench --compare` and `make profile`."""
    estimate = SLOW_STEP_SECONDS.get(step.number, lambda s, dtype: 0.0)(shape, dtype_name)
    if estimate > MAX_CALL_SECONDS:
        return f"about {estimate * 1e3:.0f} ms per call; not timed"
    if step.max_rank is not None and shape.rank > step.max_rank:
        return f"rank {shape.rank} is past the step's limit"
    if not kernel.takes_fast_path(*probe):
        return f"runs step {step.fallback}'s kernel here; its own takes {step.fast_path}"
    return None


# ---- the README table, from the JSON ------------------------------------------------------

README = REPO / "README.md"
TABLE_BEGIN = "<!-- results table: generated by `python -m mla_lab results`; do not edit -->"
TABLE_END = "<!-- end of results table -->"
# (shape, dtype, which fp32 steps compete): fp32 rows compare exact-fp32 steps with fp32 peers;
# the "tf32" row compares the TF32 step with cuBLAS allowed TF32.
TABLE_POINTS = (
    ("toy", "fp32", "fp32"), ("toy", "bf16", None), ("v2_lite@4096", "bf16", None),
    ("v2_lite@8192", "bf16", None), ("v3_tp8@4096", "bf16", None), ("v3@16384", "bf16", None),
    ("v2_lite@4096", "fp32", "fp32"), ("v2_lite@4096", "fp32", "tf32"),
)


def _step_number(name: str) -> int:
    """10 from "step 10 (three_passes)"."""
    return int(name.split()[1])


def best_step(sweep: Sweep, shape: str, dtype: str, mode: str, fp32_math: str | None = None,
              ffma_only: bool = False, prepared: bool = True) -> Result | None:
    """The fastest correct course step at one point (optionally only fp32-exact or TF32 ones, only
    those that take fp32 on the FP32 pipes, and only as called without prepared weights)."""
    candidates = []
    for r in sweep.results:
        if (r.shape, r.dtype, r.mode, r.status) != (shape, dtype, mode, "ok") or not r.name.startswith("step"):
            continue
        if not prepared and r.name.endswith(PREPARED_SUFFIX):
            continue
        step = steps.get(_step_number(r.name))
        if dtype == "fp32" and ((fp32_math is not None and step.fp32_math != fp32_math)
                                or (ffma_only and step.fp32_tensor_passes)):
            continue
        candidates.append(r)
    return min(candidates, key=lambda r: r.median_us, default=None)


def _sittings_phrase(meta: dict) -> str:
    """", in 2 sittings (2026-12-06, 2026-12-07)" for a sweep that went on from a checkpoint, without
    the dates where all fell on the day the table names; "" for one sitting."""
    sittings = meta.get("sittings", [])
    if len(sittings) < 2:
        return ""
    dates = sorted({s["date"][:10] for s in sittings})
    return f", in {len(sittings)} sittings" + (f" ({', '.join(dates)})" if len(dates) > 1 else "")


def results_table(sweep: Sweep, mode: str = "graph", with_staleness: bool = False) -> str:
    """The README's table; `with_staleness` adds a line naming the rows that changed code made stale."""
    meta = sweep.meta
    lines = [
        f"Measured on {meta['device']} (sm_{meta['compute_capability'].replace('.', '')}, driver "
        f"{meta['driver']}, torch {meta['torch']}, CUDA {meta['cuda']}) on {meta['date'][:10]}, "
        f"sources {meta['sources']}, by `{meta['command']}`{_sittings_phrase(meta)}; {mode} mode, median µs.",
        "",
        *(stale_note(sweep) if with_staleness else []),
        "| shape | dtype | best step | µs | eager µs | cuBLAS concat µs | torch.compile µs | vs eager | vs cuBLAS | of roofline floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def us(r: Result | None) -> str:
        return f"{r.median_us:,.1f}" if r and r.status == "ok" else "–"

    for shape, dtype, math_kind in TABLE_POINTS:
        best = best_step(sweep, shape, dtype, mode, math_kind)
        eager = sweep.find("eager", shape, dtype, mode)
        cublas_name = "cuBLAS concat TF32" if math_kind == "tf32" else "cuBLAS concat"
        cublas = sweep.find(cublas_name, shape, dtype, mode)
        compiled = sweep.find("torch.compile", shape, dtype, mode)
        label = f"{dtype}" + (" (TF32)" if math_kind == "tf32" else "")
        if best is None:
            lines.append(f"| {shape} | {label} | – | – | {us(eager)} | {us(cublas)} | {us(compiled)} | | | |")
            continue

        def ratio(peer: Result | None) -> str:
            return f"{peer.median_us / best.median_us:.2f}x" if peer and peer.status == "ok" else "–"

        lines.append(
            f"| {shape} | {label} | {best.name} | {us(best)} | {us(eager)} | {us(cublas)} | "
            f"{us(compiled)} | {ratio(eager)} | {ratio(cublas)} | {best.of_floor:.0%} |"
        )
    lines.append("")
    lines += dispatcher_lines(sweep, mode)
    lines.append(f"cuBLAS concat in the TF32 row is cuBLAS with TF32 allowed. Every number is in "
                 f"[{sweep_path_for(meta).relative_to(REPO)}]({sweep_path_for(meta).relative_to(REPO)}).")
    return "\n".join(lines)


def dispatcher_ratios(sweep: Sweep, mode: str = "graph", name: str = dispatch.NAME) -> list[tuple[float, Result]]:
    """`mla_lab.project` (or, named so, project given prepared weights) against cuBLAS concat (fp32:
    without TF32) at every point of the sweep that has it: (cuBLAS µs / project µs, project's
    result), worst first."""
    ratios = []
    for r in sweep.results:
        if r.name == name and r.mode == mode and r.status == "ok":
            cublas = sweep.find("cuBLAS concat", r.shape, r.dtype, mode)
            if cublas and cublas.status == "ok":
                ratios.append((cublas.median_us / r.median_us, r))
    return sorted(ratios, key=lambda pair: pair[0])


def dispatcher_table(sweep: Sweep, mode: str = "graph") -> str:
    """`mla_lab.project` at every point of the sweep: its µs beside eager's and cuBLAS's."""
    by_point = {(r.shape, r.dtype): r for _, r in dispatcher_ratios(sweep, mode)}
    ran = any(r.note for r in by_point.values())  # sweeps since the note was recorded say which step ran
    lines = [f"{'point':22}{'project µs':>12}{'eager µs':>10}{'cuBLAS µs':>11}{'vs cuBLAS':>11}" + ("  step it ran" if ran else "")]
    for shape in SHAPES:
        for dtype in DTYPES:
            r = by_point.get((shape, dtype))
            if r is None:
                continue
            eager, cublas = sweep.find("eager", shape, dtype, mode), sweep.find("cuBLAS concat", shape, dtype, mode)
            lines.append(f"{shape + ' ' + dtype:22}{r.median_us:>12,.1f}{eager.median_us:>10,.1f}"
                         f"{cublas.median_us:>11,.1f}{cublas.median_us / r.median_us:>10.2f}x"
                         + (f"  {r.note.removeprefix('ran ')}" if ran else ""))
    return "\n".join(lines)


def dispatcher_lines(sweep: Sweep, mode: str = "graph") -> list[str]:
    """One sentence on `mla_lab.project` over the whole sweep: its worst and best ratio to cuBLAS."""
    ratios = dispatcher_ratios(sweep, mode)
    if not ratios:
        return []
    (worst, w), (best, b) = ratios[0], ratios[-1]
    ahead = sum(1 for ratio, _ in ratios if ratio >= 1.0)
    lines = [f"`mla_lab.project` (the fastest step for each shape) against cuBLAS concat over all {len(ratios)} "
             f"points of the sweep: worst {worst:.2f}x ({w.shape} {w.dtype}), best {best:.2f}x ({b.shape} {b.dtype}); "
             f"ahead at {ahead}.", ""]
    prepared = dispatcher_ratios(sweep, mode, dispatch.PREPARED_NAME)
    if prepared:
        (worst, w), (best, b) = prepared[0], prepared[-1]
        lines += [f"Given its weights prepared once (`mla_lab.prepare`, as cuBLAS concat's are concatenated once), at "
                  f"the {len(prepared)} points where preparing applies: worst {worst:.2f}x ({w.shape} {w.dtype}), "
                  f"best {best:.2f}x ({b.shape} {b.dtype}); ahead at {sum(1 for ratio, _ in prepared if ratio >= 1.0)}.",
                  ""]
    return lines


def stale_note(sweep: Sweep) -> list[str]:
    """A line naming what changed since the sweep, with a blank line after it; none when nothing did."""
    recorded = sweep.meta.get("fingerprint")
    changed = fingerprint.stale_steps(recorded)
    if changed is None:
        what = "The measuring code changed since this sweep: every number waits for"
    else:
        parts = [f"Step{'s' if len(changed) > 1 else ''} {', '.join(map(str, changed))}"] if changed else []
        if fingerprint.dispatcher_stale(recorded):
            parts.append(f"{dispatch.NAME}'s rules")
        if not parts:
            return []
        several = len(changed) > 1 or len(parts) > 1
        what = f"{' and '.join(parts)} changed since this sweep: {'their' if several else 'its'} rows wait for"
    return [f"**Stale.** {what} `make gpu-check` on a GPU.", ""]


@dataclass
class Target:
    goal: str
    measured: str
    met: bool | None  # None: not measured in this sweep


def slow_end(result: Result) -> float:
    """A result's p90 (its median where the record has no spread)."""
    return result.p90_us if result.p90_us is not None else result.median_us


def targets(sweep: Sweep, mode: str = "graph") -> list[Target]:
    """The course's performance targets, judged on one sweep's numbers. A target is met when the
    step's slow end (p90) beats it, not its median: a ratio inside the run-to-run spread is not a win."""

    def at(name, shape, dtype):
        r = sweep.find(name, shape, dtype, mode)
        return r if r is not None and r.status == "ok" else None

    report = []

    def absolute(shape, dtype, limit_us, fp32_math=None):
        best = best_step(sweep, shape, dtype, mode, fp32_math)
        eager = at("eager", shape, dtype)
        goal = f"{shape} {dtype}: best step <= {limit_us} us"
        if best is None:
            report.append(Target(goal, "not measured", None))
            return
        versus = f", {eager.median_us / best.median_us:.1f}x eager" if eager else ""
        report.append(Target(goal, f"{best.name} {best.median_us:.1f} us (p90 {slow_end(best):.1f}){versus}",
                             slow_end(best) <= limit_us))

    def relative(shape, dtype, peer, factor, fp32_math=None, label=None, ffma_only=False):
        best, other = best_step(sweep, shape, dtype, mode, fp32_math, ffma_only), at(peer, shape, dtype)
        goal = f"{shape} {label or dtype}: best step >= {factor}x {peer}"
        if best is None or other is None:
            report.append(Target(goal, "not measured", None))
            return
        ratio, at_p90 = other.median_us / best.median_us, other.median_us / slow_end(best)
        report.append(Target(goal, f"{best.name} {best.median_us:,.1f} us vs {other.median_us:,.1f} us: {ratio:.2f}x, "
                                   f"{at_p90:.2f}x at its p90 (rel. error {best.rel_error:.0e})", at_p90 >= factor))

    absolute("toy", "fp32", 3.0)
    absolute("toy", "bf16", 2.5)
    for shape in ("v2_lite@4096", "v2_lite@8192", "v3_tp8@4096"):
        relative(shape, "bf16", "cuBLAS concat", 1.1)
    relative("v3@16384", "bf16", "cuBLAS concat", 1.0)
    relative("v3@16384", "bf16", "eager", 1.5)
    relative("v2_lite@4096", "fp32", "cuBLAS concat", 0.9, "fp32", "fp32 (FFMA steps)", ffma_only=True)
    relative("v2_lite@4096", "fp32", "cuBLAS concat TF32", 1.0, "tf32", "fp32 (TF32 steps)")
    return report


def point_table(sweep: Sweep, shape: str, mode: str = "graph") -> str:
    """Every contender at one sweep point, fp32 and bf16 side by side (µs, or why there is none)."""

    def cell(name: str, dtype: str) -> str:
        r = sweep.find(name, shape, dtype, mode)
        if r is None:
            return "–"
        return f"{r.median_us:,.1f}" if r.status == "ok" else r.status

    names = list(dict.fromkeys(r.name for r in sweep.results if r.shape == shape and r.mode == mode))
    names.sort(key=lambda n: (0, _step_number(n), "") if n.startswith("step") else (1, 0, n))
    width = max(len(name) for name in names)
    lines = [f"{shape}, {mode} mode, median µs", f"{'':{width}} {'fp32':>10} {'bf16':>10}"]
    lines += [f"{name:{width}} {cell(name, 'fp32'):>10} {cell(name, 'bf16'):>10}" for name in names]
    return "\n".join(lines)


def targets_table(sweep: Sweep, mode: str = "graph") -> str:
    lines = ["| target | measured | met |", "|---|---|---|"]
    for t in targets(sweep, mode):
        verdict = "not measured" if t.met is None else ("yes" if t.met else "**no**")
        lines.append(f"| {t.goal} | {t.measured} | {verdict} |")
    return "\n".join(lines)


def sweep_path_for(meta: dict) -> Path:
    return RESULTS_DIR / f"{device_slug(meta['device'])}.json"


def readme_with_table(readme: str, table: str) -> str:
    if TABLE_BEGIN not in readme or TABLE_END not in readme:
        raise ValueError(f"README.md has no results-table markers ({TABLE_BEGIN!r} ... {TABLE_END!r})")
    head, rest = readme.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    return f"{head}{TABLE_BEGIN}\n{table}\n{TABLE_END}{tail}"


def committed_sweeps() -> list[Path]:
    return sorted(RESULTS_DIR.glob("*.json"))


def of_device(device: str) -> Sweep | None:
    """The committed sweep measured on this GPU model, if there is one."""
    return next((record for record in map(Sweep.load, committed_sweeps()) if record.meta.get("device") == device),
                None)


def newest(paths: Iterable[Path] | None = None) -> Sweep:
    """The sweep measured last (of `paths`, by default the committed ones): what the README's table
    and the notebooks' stored results show."""
    paths = list(paths) if paths is not None else committed_sweeps()
    if not paths:
        raise FileNotFoundError("results/ holds no sweep: run `make gpu-results` on a GPU machine and commit results/")
    return max((Sweep.load(path) for path in paths), key=lambda record: record.meta["date"])


def stored_table(contenders: Iterable[int | str], points: Iterable[str], mode: str = "graph",
                 against: str = "cuBLAS concat") -> str:
    """Stored results for a notebook's look-back: the newest sweep's median µs for some steps
    (by number) and peers at some points ("v2_lite@4096 bf16"), each with its speed against
    `against` at that point. It prints the same on any machine, GPU or not, so a look-back that
    quotes it keeps its numbers when the notebook runs elsewhere."""
    record = newest()
    meta = record.meta
    names = [steps.get(c).label if isinstance(c, int) else c for c in contenders]
    columns = [point.split() for point in points]
    header = (f"stored: {meta['device']}, {meta['date'][:10]}, sources {meta['sources']} "
              f"({sweep_path_for(meta).relative_to(REPO)}), {mode} mode, median µs (x {against})")

    def cell(name: str, shape: str, dtype: str) -> str:
        r, peer = record.find(name, shape, dtype, mode), record.find(against, shape, dtype, mode)
        if r is None or r.status != "ok":
            return "–" if r is None else r.status
        ratio = f" ({peer.median_us / r.median_us:.2f}x)" if peer and peer.status == "ok" and name != against else ""
        return f"{r.median_us:,.1f}{ratio}"

    width = max(len(name) for name in names)
    lines = [header, f"{'':{width}}" + "".join(f"  {' '.join(column):>20}" for column in columns)]
    lines += [f"{name:{width}}" + "".join(f"  {cell(name, *column):>20}" for column in columns) for name in names]
    return "\n".join(lines)
