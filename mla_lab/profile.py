"""Stored profiles: Nsight Compute's view of every step, kept in results/ for machines that cannot
read hardware counters (most rented GPUs refuse them: ERR_NVGPUCTRPERM) or have no GPU.

    make profile                    every step at the toy and at V2-Lite 4096 tokens, both dtypes, and
                                    at 1 and 16 decode tokens (bf16), into results/profiles/<device>.json
                                    (GPU, ncu: all calls under one ncu, each behind a marker kernel)
    python -m mla_lab profile ex05  your kernel, where counters can be read; then the stored one

A step's call may launch several kernels (step 11: two; steps 9 and 10: a transpose, then two
GEMMs): times and bytes are summed over them, rates weighted by each kernel's time, registers and
shared memory the largest; each kernel's own time is kept too, in launch order, so that a call that
got slower says which of its kernels did (ncu runs them one after another, with no overlap).
`moved` says in one sentence what changed from one step to the next.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import steps
from .gpu_check import IMPORTABLE

PROFILES_DIR = steps.REPO / "results" / "profiles"  # beside the sweeps, not among them
# One and 16 decode tokens in bf16: what the decode steps (11, 12) pay per token beyond the first.
POINTS = ("toy fp32", "toy bf16", "v2_lite@4096 fp32", "v2_lite@4096 bf16", "v2_lite@1 bf16", "v2_lite@16 bf16")

# summary field: (ncu metric, how kernels of one call combine: "sum", "max" or "time-weighted")
METRICS = {
    "duration_us": ("gpu__time_duration.sum", "sum"),
    "dram_read_bytes": ("dram__bytes_read.sum", "sum"),
    "dram_write_bytes": ("dram__bytes_write.sum", "sum"),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct", "time-weighted"),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "time-weighted"),
    "registers": ("launch__registers_per_thread", "max"),
    "shared_bytes": ("launch__shared_mem_per_block_dynamic", "max"),
    "tensor_pipe_pct": ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "time-weighted"),
    "fma_pipe_pct": ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "time-weighted"),
    "bank_conflicts": ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", "sum"),
}
STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "mio_throttle", "math_pipe_throttle", "wait",
          "lg_throttle", "not_selected", "membar", "dispatch_stall")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: launched before each profiled call, it marks where one starts
# ncu names units both ways across versions ("ns" in Nsight Compute 2025, "nsecond" in older ones)
_UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6,
          "byte": 1.0, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}


def metric_names() -> list[str]:
    return [metric for metric, _ in METRICS.values()] + [STALL_METRIC.format(s) for s in STALLS]


def value_of(text: str, unit: str) -> float:
    """A CSV value in the summary's units: µs for times, bytes for sizes ("1,234.5" and "Kbyte" alike)."""
    number = float(text.replace(",", "")) if text.strip() not in ("", "n/a") else 0.0
    base = unit.split("/")[0]  # "Kbyte/block" is bytes per block
    return number * _UNITS.get(base, 1.0)


def parse(csv_text: str) -> list[tuple[str, dict[str, float]]]:
    """ncu --csv's long format (a row per kernel and metric) as (kernel name, {metric: value}) per
    kernel, in launch order."""
    rows = [line for line in csv_text.splitlines() if line.startswith('"')]  # ncu's own lines start with ==PROF==
    names: dict[str, str] = {}
    kernels: dict[str, dict[str, float]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(rows))):
        names[row["ID"]] = row["Kernel Name"]
        kernels.setdefault(row["ID"], {})[row["Metric Name"]] = value_of(row["Metric Value"], row.get("Metric Unit", ""))
    return [(names[k], kernels[k]) for k in sorted(kernels, key=int)]


def split_calls(kernels: list[tuple[str, dict[str, float]]]) -> list[list[dict[str, float]]]:
    """The kernels of each profiled call: every call follows one marker kernel (MARKER)."""
    calls: list[list[dict[str, float]]] = []
    for name, metrics in kernels:
        if MARKER in name:
            calls.append([])
        elif calls:
            calls[-1].append(metrics)
        else:
            raise RuntimeError(f"ncu's report begins with {name}, not with a call's marker")
    return calls


def summarize(kernels: list[dict[str, float]]) -> dict[str, float | list[float]]:
    """One call's profile from its kernels' metrics (see the module's docstring for how they combine)."""
    times = [k.get(METRICS["duration_us"][0], 0.0) for k in kernels]
    total = sum(times) or 1.0
    summary: dict[str, float | list[float]] = {"kernels": float(len(kernels)), "kernel_us": times}
    for field, (metric, how) in METRICS.items():
        values = [k.get(metric, 0.0) for k in kernels]
        if how == "sum":
            summary[field] = sum(values)
        elif how == "max":
            summary[field] = max(values, default=0.0)
        else:
            summary[field] = sum(v * t for v, t in zip(values, times)) / total
    stalls = {s: sum(k.get(STALL_METRIC.format(s), 0.0) * t for k, t in zip(kernels, times)) / total for s in STALLS}
    for name, value in sorted(stalls.items(), key=lambda item: -item[1])[:3]:
        summary[f"stall {name}"] = value
    return summary


def _ratio_phrase(name: str, before: float, after: float, fewer: str, more: str) -> str | None:
    if before <= 0 or after <= 0:
        return None
    ratio = after / before
    if 0.8 <= ratio <= 1.25:
        return None
    return f"{name} {1 / ratio:.1f}x {fewer}" if ratio < 1 else f"{name} {ratio:.1f}x {more}"


def moved(before: dict[str, float], after: dict[str, float]) -> str:
    """One sentence on what changed most between two profiles ("DRAM reads 8.1x fewer, the tensor
    pipe from 0 to 61 %"), or that little did."""
    phrases = [
        _ratio_phrase("time", before["duration_us"], after["duration_us"], "shorter", "longer"),
        _ratio_phrase("DRAM reads", before["dram_read_bytes"], after["dram_read_bytes"], "fewer", "more"),
        _ratio_phrase("shared-memory bank conflicts", before["bank_conflicts"], after["bank_conflicts"], "fewer", "more"),
    ]
    for field, name in (("tensor_pipe_pct", "the tensor pipe"), ("fma_pipe_pct", "the FMA pipe"),
                        ("occupancy_pct", "occupancy")):
        if abs(after[field] - before[field]) >= 10:
            phrases.append(f"{name} from {before[field]:.0f} to {after[field]:.0f} %")
    said = [p for p in phrases if p]
    return ", ".join(said) if said else "no counter moved by more than a quarter"


def stored_path(device_slug: str) -> Path:
    return PROFILES_DIR / f"{device_slug}.json"


def ncu() -> str | None:
    found = shutil.which("ncu")
    for candidate in ([found] if found else []) + sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu")) + \
            [Path("/usr/local/cuda/bin/ncu")]:
        if candidate and Path(candidate).exists():
            return str(candidate)
    return None


def why_not(output: str) -> str:
    """ncu's refusal in one line, with what it means."""
    if "ERR_NVGPUCTRPERM" in output:
        return ("this GPU refuses its performance counters to this user (ERR_NVGPUCTRPERM), as rented and "
                "cloud GPUs usually do")
    if "LibraryNotLoaded" in output:
        return "Nsight Compute cannot load its profiler library here (a sandboxed runtime)"
    last = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
    return f"ncu failed: {last[0][:160]}"


def profile_calls(plan: list[tuple[int, str]], variant: str = "solution") -> list[dict[str, float]]:
    """Each (step, point) of the plan called once under one ncu: a summary per call. Raises
    RuntimeError(why) if the counters cannot be read here."""
    tool = ncu()
    if tool is None:
        raise RuntimeError("Nsight Compute (ncu) is not installed here")
    command = [tool, "--csv", "--clock-control", "none", "--profile-from-start", "off",
               "--metrics", ",".join(metric_names()), sys.executable, "-m", "mla_lab", "profile", "--calls",
               ";".join(f"{step}:{point}" for step, point in plan), "--variant", variant]
    done = subprocess.run(command, capture_output=True, text=True, cwd=steps.REPO, env={**os.environ, **IMPORTABLE},
                          timeout=1200)
    logs = os.environ.get("MLA_LAB_LOGS")
    if logs:  # ncu's own words, for when the summary looks wrong
        Path(logs).mkdir(parents=True, exist_ok=True)
        (Path(logs) / "ncu.csv").write_text(done.stdout + done.stderr)
    kernels = parse(done.stdout)
    if done.returncode != 0 or not kernels:
        raise RuntimeError(why_not(done.stdout + done.stderr))
    return summaries(kernels, len(plan))


def summaries(kernels: list[tuple[str, dict[str, float]]], calls_made: int) -> list[dict[str, float]]:
    """The kernels ncu saw in `calls_made` marked calls: one summary per call, in the order they were made."""
    calls = split_calls(kernels)
    if len(calls) != calls_made or not all(calls):
        raise RuntimeError(f"ncu reported {len(calls)} calls for the {calls_made} made")
    return [summarize(call) for call in calls]


def profile_call(step: int, point: str, variant: str = "solution") -> dict[str, float]:
    return profile_calls([(step, point)], variant)[0]


def calls(plan: str, variant: str) -> None:
    """The child ncu watches: build and warm up every call of the plan ("6:toy bf16;11:v2_lite@1
    bf16"), then make each once inside the profiled range, behind a marker kernel."""
    import torch

    from . import sweep
    from .problem import make_inputs

    made = []
    for item in plan.split(";"):
        step, point = item.split(":")
        _, shape, _, dtype = sweep.point(point)
        kernel = steps.load(int(step), variant)
        inputs = make_inputs(shape, dtype, "cuda", 0)
        kernel(*inputs, shape.heads)
        made.append((kernel, inputs, shape.heads))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for kernel, inputs, heads in made:
        torch.cuda._sleep(1000)
        kernel(*inputs, heads)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def run_all() -> Path:
    """`make profile`: every step at every point the sweep times it, into results/profiles/<device>.json."""
    import torch

    from . import sweep
    from .problem import make_inputs

    device = torch.cuda.get_device_name()
    verdicts: dict[tuple[int, str], dict[str, float] | str] = {}
    plan = []
    for point in POINTS:
        _, shape, dtype_name, dtype = sweep.point(point)
        probe = make_inputs(shape, dtype, "cuda", 0)
        for step in steps.STEPS:
            why = sweep.why_not_timed(step, steps.load(step.number), shape, dtype_name, probe)
            if why is None:
                plan.append((step.number, point))
            else:
                verdicts[step.number, point] = why
    verdicts.update(zip(plan, profile_calls(plan)))  # a refusal raises: a stored file is never overwritten by one
    return store(device, verdicts)


def store(device: str, verdicts: dict[tuple[int, str], dict[str, float] | str]) -> Path:
    """Each step's profile (or why it has none) at every point, in course order, for this device."""
    from . import sweep

    profiles = {step.label: {point: verdicts[step.number, point] for point in POINTS if (step.number, point) in verdicts}
                for step in steps.STEPS}
    for label, points in profiles.items():
        for point, verdict in points.items():
            print(f"{label} {point}: {verdict}", flush=True)
    path = stored_path(sweep.device_slug(device))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device, "profiles": profiles}, indent=1) + "\n")
    return path


def describe(summary: dict) -> str:
    """A stored summary in words and units a learner reads at a glance."""
    hit = summary["l2_hit_pct"]
    # A hit rate past 100 % is ncu's hits and lookups counted on different replays of a short call.
    l2 = f"L2 hit {hit:.0f} %" + (" (counts from different replays disagree: unreliable)" if hit > 100 else "")
    stalls = ", ".join(f"{name[len('stall '):]} {value:.1f}" for name, value in summary.items() if name.startswith("stall "))
    kernels = int(summary["kernels"])
    each = " + ".join(f"{t:,.1f}" for t in summary.get("kernel_us", []))  # profiles stored before it lack it
    each = f" ({each})" if kernels > 1 and each else ""
    return (f"{summary['duration_us']:,.1f} µs in {kernels} kernel{'s' if kernels > 1 else ''}{each}; DRAM "
            f"{summary['dram_read_bytes'] / 1e6:,.2f} MB read, {summary['dram_write_bytes'] / 1e6:,.2f} MB written; "
            f"{l2}; occupancy {summary['occupancy_pct']:.0f} %; {summary['registers']:.0f} registers a thread, "
            f"{summary['shared_bytes'] / 1024:,.0f} KiB shared a block; tensor pipe {summary['tensor_pipe_pct']:.0f} %, "
            f"FMA pipe {summary['fma_pipe_pct']:.0f} %; {summary['bank_conflicts']:,.0f} shared-memory bank conflicts; "
            f"top stalls (cycles per issue): {stalls}")


def _stored() -> dict | None:
    """The stored profiles (the first device's file), or None before `make profile` has run."""
    paths = sorted(PROFILES_DIR.glob("*.json"))
    return json.loads(paths[0].read_text()) if paths else None


def show(step: int, point: str) -> str:
    """A step's stored profile at one point and what moved from the step it builds on."""
    from .grade import BASELINE_STEPS

    data = _stored()
    if data is None:
        return "no stored profiles yet: `make profile` on a GPU whose counters can be read writes them"
    label = steps.get(step).label
    mine = data["profiles"].get(label, {}).get(point)
    if not isinstance(mine, dict):
        return f"{label} at {point}: no stored profile ({mine or 'not profiled'})"
    lines = [f"{label} at {point}, stored on {data['device']}:", f"  {describe(mine)}"]
    previous = BASELINE_STEPS.get(step, step - 1)
    before = data["profiles"].get(steps.get(previous).label, {}).get(point) if previous >= 1 else None
    if isinstance(before, dict):
        lines.append(f"  against step {previous}: {moved(before, mine)}")
    return "\n".join(lines)


def show_nearest(step: int, point: str) -> str:
    """The stored profile at `point`, and where none is stored there yet, also the step's nearest
    stored one (the same dtype first)."""
    data = _stored()
    profiled = data["profiles"].get(steps.get(step).label, {}) if data else {}
    if isinstance(profiled.get(point), dict):
        return show(step, point)
    others = sorted((p for p, summary in profiled.items() if isinstance(summary, dict)),
                    key=lambda other: other.split()[1] != point.split()[1])
    return "\n".join([show(step, point), *[show(step, other) for other in others[:1]]])
