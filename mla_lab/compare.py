"""Your run beside the stored run: is a difference the GPU or the kernel?

    python -m mla_lab bench --compare            (the exercises as you wrote them)
    python -m mla_lab bench --compare --solutions

A number alone cannot say: an H100 PCIe is slower than an H100 SXM at everything, a warm or
power-capped GPU runs slower clocks, and a slow kernel is slow everywhere. A ratio can: cuBLAS is
timed beside each step in the same run, on the same GPU at the same clocks, so the step's ratio to
cuBLAS cancels the GPU out. Stored and yours, per step at a few sweep points:

    same ratio (within SAME_RATIO), different µs -> the GPU (or its clocks) differs, not the kernel
    different ratio                              -> the kernel differs from the one stored
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import bench, steps, sweep
from .problem import make_inputs

POINTS = ("toy fp32", "toy bf16", "v2_lite@4096 bf16", "v2_lite@1 bf16")
SAME_RATIO = 0.15  # run-to-run spread of a ratio on one GPU is a few percent; beyond this, the kernel
PEER = "cuBLAS concat"


@dataclass
class Row:
    step: str
    point: str
    yours_us: float
    your_peer_us: float
    stored_us: float | None
    stored_peer_us: float | None
    same_source: bool = False  # the very code the stored run measured (the solutions, unchanged since)

    @property
    def verdict(self) -> str:
        return verdict(self.yours_us, self.your_peer_us, self.stored_us, self.stored_peer_us, self.same_source)


def verdict(yours_us: float, your_peer_us: float, stored_us: float | None, stored_peer_us: float | None,
            same_source: bool = False) -> str:
    """One clause: whether the difference from the stored run is the GPU or the kernel."""
    if stored_us is None or stored_peer_us is None:
        return "nothing stored to compare with"
    yours, stored = your_peer_us / yours_us, stored_peer_us / stored_us
    change = yours / stored - 1.0
    if abs(change) <= SAME_RATIO:
        speed = stored_us / yours_us
        gpu = "the same speed" if abs(speed - 1.0) <= SAME_RATIO else f"{speed:.2f}x the stored speed"
        return f"the kernel is the stored one's equal ({yours:.2f}x {PEER}, stored {stored:.2f}x); the GPU runs it at {gpu}"
    direction = "faster" if change > 0 else "slower"
    if same_source:
        # The ratio cancels the GPU only where the step and cuBLAS are held back by the same thing.
        return (f"the stored kernel itself (same source), {abs(change):.0%} {direction} against {PEER} than stored "
                f"({yours:.2f}x, stored {stored:.2f}x): not the code, but a GPU or clocks that favour what limits "
                f"this step over what limits {PEER}, or a noisy run")
    return (f"the kernel: {abs(change):.0%} {direction} against {PEER} than stored ({yours:.2f}x, stored "
            f"{stored:.2f}x), which no GPU difference explains")


def table(rows: list[Row], stored: sweep.Sweep, device: str) -> str:
    lines = [f"yours: {device}; stored: {stored.meta['device']} ({sweep.sweep_path_for(stored.meta).name}, "
             f"{stored.meta['date'][:10]}); graph mode, median µs",
             f"{'step':24}{'point':20}{'yours':>10}{'stored':>10}  verdict"]
    for row in rows:
        stored_us = f"{row.stored_us:,.1f}" if row.stored_us else "–"
        lines.append(f"{row.step:24}{row.point:20}{row.yours_us:>10,.1f}{stored_us:>10}  {row.verdict}")
    return "\n".join(lines)


def run(variant: str | None = None, points: tuple[str, ...] = POINTS) -> str:
    """Time every exercise that takes each point beside cuBLAS, and set it beside the stored run
    (the learner's files unless variant="solution"; MLA_LAB_EXERCISE_SOURCE sets the default)."""
    variant = variant or steps.exercise_variant()
    device = torch.cuda.get_device_name()
    stored = sweep.of_device(device) or sweep.newest()
    same_source = variant == "solution" and stored.meta.get("sources") == sweep.sources_fingerprint()
    rows = []
    for point in points:
        shape_name, shape, dtype_name, dtype = sweep.point(point)
        probe = make_inputs(shape, dtype, "cuda", 0)
        kernels = {}
        for step in steps.exercises():
            kernel = steps.load(step, variant)
            if sweep.why_not_timed(step, kernel, shape, dtype_name, probe) is None:
                kernels[step.label] = kernel
        try:
            timings = {t.name: t.median_us for t in bench.compare(kernels, shape, dtype, "graph")}
        except AssertionError as wrong:  # a kernel that is wrong here gets no number
            return f"{point}: {wrong}; fix it (python -m mla_lab grade) before comparing speeds"
        for name in kernels:
            mine, theirs = stored.find(name, shape_name, dtype_name), stored.find(PEER, shape_name, dtype_name)
            rows.append(Row(name, point, timings[name], timings[PEER],
                            mine.median_us if mine and mine.status == "ok" else None,
                            theirs.median_us if theirs and theirs.status == "ok" else None, same_source))
    return table(rows, stored, device)
