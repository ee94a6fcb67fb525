"""Figures for the notebooks, drawn from measured or computed data only."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullFormatter

from . import layout
from .bench import Timing
from .problem import Shape


def address_map(shape: Shape, tokens: int = 3):
    """Who owns each address of the stacked output: k and v of every head, token by token."""
    codes = layout.address_map(shape, tokens)
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.45 * tokens))
    cmap = plt.get_cmap("tab20", 2 * shape.heads)
    ax.imshow(codes, aspect="auto", cmap=cmap, interpolation="nearest")
    for kv, name in enumerate("kv"):
        for h in range(shape.heads):
            column = layout.row_column(shape, kv, h, shape.head_dim // 2)
            ax.text(column, 0, f"{name}{h}", ha="center", va="center", fontsize=8)
    ax.set_xlabel(f"element offset within a token's row (row length 2*H*hd = {2 * shape.width})")
    ax.set_ylabel("token")
    ax.set_yticks(range(tokens))
    ax.set_title(f"(B, S, 2, H, hd) in memory: token t owns offsets [t*{2 * shape.width}, (t+1)*{2 * shape.width}): k heads, then v heads")
    fig.tight_layout()
    return fig


def time_per_step(timings: list[Timing], title: str):
    """Horizontal bars of median time, with the 10th-90th percentile as error bars."""
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(timings)))
    names = [t.name for t in timings]
    medians = torch.tensor([t.median_us for t in timings])
    spread = torch.tensor([[t.median_us - t.low_us for t in timings], [t.high_us - t.median_us for t in timings]])
    ax.barh(names, medians, xerr=spread, color="tab:blue")
    for y, t in enumerate(timings):
        ax.text(t.median_us, y, f" {t.median_us:.1f} us", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels on a log axis collide
    ax.invert_yaxis()
    ax.set_xlabel("median time per call, us (log scale)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def roofline(ceilings: dict[str, float], points: dict[str, tuple[float, float]], dtype_peak: str):
    """Attainable TFLOP/s against arithmetic intensity, with measured (intensity, TFLOP/s) points."""
    peak = ceilings[dtype_peak]
    bandwidth = ceilings["copy TB/s"]
    intensity = torch.logspace(-1, 4, 200)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(intensity, torch.clamp(intensity * bandwidth, max=peak), "k-", label=f"roofline: {dtype_peak} {peak:.0f}, copy {bandwidth:.1f} TB/s (measured)")
    for name, (x, y) in points.items():
        ax.loglog([x], [y], "o", label=name)
    ax.set_xlabel("arithmetic intensity, FLOP per byte of minimum traffic")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def _ok(sweep, dtype: str, mode: str):
    return [r for r in sweep.results if r.dtype == dtype and r.mode == mode and r.status == "ok"]


def _by_contender(rows):
    """(marker, name, its rows) for each contender, in the sweep's order: one marker per contender."""
    markers = "os^vD<>pP*hX"
    names = dict.fromkeys(r.name for r in rows)
    return [(markers[i % len(markers)], name, [r for r in rows if r.name == name]) for i, name in enumerate(names)]


def speed_vs_tokens(sweep, dtype: str, family: str = "v2_lite", mode: str = "graph"):
    """Median time per call against tokens, one line per step and peer, from a sweep's JSON."""
    rows = [r for r in _ok(sweep, dtype, mode) if r.shape.split("@")[0] == family]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name in dict.fromkeys(r.name for r in rows):
        points = sorted((r.tokens, r.median_us) for r in rows if r.name == name)
        style = "-o" if name.startswith("step") else "--s"
        ax.loglog([p[0] for p in points], [p[1] for p in points], style, label=name, markersize=4)
    ax.set_xlabel("tokens (batch x sequence)")
    ax.set_ylabel(f"median time per call, us ({mode} mode)")
    meta = sweep.meta
    ax.set_title(f"{family} {dtype} on {meta['device']}, {meta['date'][:10]}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def roofline_sweep(sweep, dtype: str, mode: str = "graph"):
    """Every correct result of one dtype on the device's measured roofline."""
    from .sweep import SHAPES, DTYPES

    ceilings = sweep.meta["ceilings"]
    peak_name = "bf16 matmul TFLOP/s" if dtype == "bf16" else "fp32 matmul TFLOP/s"
    bandwidth = ceilings["copy TB/s"]
    intensity = torch.logspace(0, 4, 200)
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.loglog(intensity, torch.clamp(intensity * bandwidth, max=ceilings[peak_name]), "k-",
              label=f"{peak_name.split(' TFLOP')[0]} {ceilings[peak_name]:.0f} TFLOP/s, copy {bandwidth:.1f} TB/s")
    if dtype == "fp32":
        tf32 = ceilings["tf32 matmul TFLOP/s"]
        ax.loglog(intensity, torch.clamp(intensity * bandwidth, max=tf32), "k:", label=f"tf32 matmul {tf32:.0f} TFLOP/s")
    for marker, name, rows in _by_contender(_ok(sweep, dtype, mode)):
        shapes = [SHAPES[r.shape] for r in rows]
        ax.loglog([s.flops() / s.min_bytes(DTYPES[dtype]) for s in shapes], [r.tflops for r in rows], marker,
                  label=name, alpha=0.8)
    ax.set_xlabel("arithmetic intensity, FLOP per byte of minimum traffic (one point per shape)")
    ax.set_ylabel("achieved TFLOP/s (useful FLOPs)")
    ax.set_title(f"{dtype}, {mode} mode, on {sweep.meta['device']} (ceilings measured in the same run)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def accuracy_vs_speed(sweep, dtype: str, mode: str = "graph"):
    """Relative error against float64 versus TFLOP/s, every correct result of one dtype: what each
    way of doing the arithmetic (FFMA, one TF32 pass, three TF32 passes, bf16 tensor cores) costs
    in accuracy and buys in speed, beside cuBLAS (in fp32 also cuBLAS with TF32 allowed)."""
    from .check import TF32_TOLERANCE, TOLERANCE
    from .sweep import DTYPES

    fig, ax = plt.subplots(figsize=(8, 5))
    for marker, name, rows in _by_contender([r for r in _ok(sweep, dtype, mode) if r.rel_error]):
        peer = not name.startswith("step")
        ax.loglog([r.tflops for r in rows], [r.rel_error for r in rows], marker, label=name,
                  alpha=0.8, markersize=9 if peer else 6, markerfacecolor="none" if peer else None)
    ax.axhline(TOLERANCE[DTYPES[dtype]], color="k", linestyle="-", linewidth=0.8,
               label=f"{dtype} tolerance {TOLERANCE[DTYPES[dtype]]:.0e}")
    if dtype == "fp32":
        ax.axhline(TF32_TOLERANCE, color="k", linestyle=":", linewidth=0.8,
                   label=f"TF32 tolerance {TF32_TOLERANCE:.0e}")
    ax.set_xlabel(f"achieved TFLOP/s ({mode} mode, one point per shape)")
    ax.set_ylabel("relative error against float64")
    ax.set_title(f"{dtype}: accuracy against speed on {sweep.meta['device']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def sweep_figures(sweep) -> dict[str, object]:
    """The figures committed beside a results file: name -> matplotlib figure."""
    figures = {}
    for dtype in ("bf16", "fp32"):
        if _ok(sweep, dtype, "graph"):
            figures[f"speed_vs_tokens_{dtype}"] = speed_vs_tokens(sweep, dtype)
            figures[f"roofline_{dtype}"] = roofline_sweep(sweep, dtype)
            figures[f"accuracy_vs_speed_{dtype}"] = accuracy_vs_speed(sweep, dtype)
    return figures


def fragment(name: str):
    """One tensor-core fragment (mla_lab.layouts.FRAGMENTS): each element of the tile, colored by
    the lane that holds it and labeled with its lane and register."""
    from .layouts import FRAGMENTS, owners

    layout, rows, columns, registers = FRAGMENTS[name]
    held = owners(layout, rows, columns, registers)
    fig, ax = plt.subplots(figsize=(0.55 * columns + 1.2, 0.42 * rows + 1.0))
    colors = plt.get_cmap("tab20")
    for (row, column), (lane, register) in held.items():
        ax.add_patch(plt.Rectangle((column, row), 1, 1, color=colors(lane % 20), alpha=0.35 + 0.15 * (lane // 20)))
        ax.text(column + 0.5, row + 0.5, f"T{lane}\nr{register}", ha="center", va="center", fontsize=6)
    ax.set_xlim(0, columns)
    ax.set_ylim(rows, 0)
    ax.set_xticks(range(columns))
    ax.set_yticks(range(rows))
    ax.set_xlabel("column (k for A, n for B and C)")
    ax.set_ylabel("row")
    ax.set_title(f"{name}: lane T and register r of each element", fontsize=9)
    fig.tight_layout()
    return fig


def failure_map(got: torch.Tensor, expected: torch.Tensor, shape, tolerance: float):
    """Where an output is wrong, as a picture: tokens down, the 2 * H * hd columns of k then v
    across; wrong values in red, never-written elements (still NaN) in black. The title is the
    grader's one line (mla_lab.failure_map.describe)."""
    from matplotlib.colors import ListedColormap

    from .failure_map import describe, wrong_elements

    wrong = wrong_elements(got, expected, tolerance).reshape(shape.tokens, -1)
    unwritten = ~torch.isfinite(got.reshape(shape.tokens, -1))
    picture = torch.where(unwritten, 2, wrong.long())
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.imshow(picture.numpy(), aspect="auto", interpolation="nearest", vmin=0, vmax=2,
              cmap=ListedColormap(["#f2f2f2", "#d62728", "black"]))
    width = shape.heads * shape.head_dim
    ax.axvline(width - 0.5, color="k", linewidth=1)
    ax.set_xticks([width / 2, width + width / 2], ["k (H x hd)", "v (H x hd)"])
    ax.set_ylabel("token (batch x seq)")
    ax.set_title(describe(got, expected, shape, tolerance) or "no element stands out", fontsize=8, wrap=True)
    fig.tight_layout()
    return fig
