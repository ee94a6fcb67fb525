"""The correctness harness: every kernel against a float64 oracle, on fresh inputs, with poison.

Protocol: for each shape and dtype, draw fresh random inputs per trial, fill the output with NaN,
run the kernel into it, and compare with the float64 reference by relative Frobenius error
||out - ref|| / ||ref||. NaN or Inf never pass (a NaN left over means an element was not written).
When a check fails, `diagnose` names the likely mistake: k and v swapped, heads laid out per head,
zeros, or the first wrong element.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from . import failure_map
from .problem import V2_LITE, V3, Inputs, Shape, make_inputs, oracle

# Relative Frobenius error allowed against float64, by input dtype. fp32 accumulation over
# d_model = 7168 terms stays near 4e-6; bf16 inputs and outputs round at about 4e-3.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
# A step whose fp32 path runs on TF32 tensor cores (10-bit mantissa, unit roundoff u = 2^-11) is
# held to 2e-3 on fp32 inputs, about 4u: each product of the two GEMMs multiplies four rounded
# operands (hidden, w_down, the latent, w_up). The error is typically 4e-4, but where a handful of
# roundings decide it the tail is wide: rounding emulated exactly (tests/test_check.py) passed
# 1e-3 on 2 of 2,000 draws of the rank-1 shape (up to 1.2e-3), as step 5 once did on the H200.
# A step says it runs TF32 with `fp32_math = "tf32"`.
TF32_TOLERANCE = 2e-3


def tf32_round(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32 (10-bit mantissa, nearest, ties away from zero), as
    cvt.rna.tf32.f32 rounds the operands of a TF32 tensor-core instruction."""
    bits = t.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t as two TF32 values: hi = t rounded, lo = what that leaves (exact in fp32), rounded."""
    hi = tf32_round(t)
    return hi, tf32_round(t.float() - hi)


def three_tf32_passes(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b on TF32 tensor cores with fp32's accuracy: a_lo b_hi + a_hi b_lo + a_hi b_hi, small
    terms first. A product of two TF32 values is exact in fp32, so only the fp32 sums round; the
    dropped a_lo b_lo is about 2^-22 of a product, below fp32's own rounding."""
    (a_hi, a_lo), (b_hi, b_lo) = tf32_parts(a), tf32_parts(b)
    return a_lo @ b_hi + a_hi @ b_lo + a_hi @ b_hi


def toward_zero(x: torch.Tensor) -> torch.Tensor:
    """float64 values rounded to fp32 toward zero (returned as float64)."""
    nearest = x.float()
    past = nearest.double().abs() > x.abs()
    return torch.where(past, torch.nextafter(nearest, torch.zeros_like(nearest)), nearest).double()


def three_tf32_passes_on_tensor_cores(a: torch.Tensor, b: torch.Tensor, run_chunks: int) -> torch.Tensor:
    """three_tf32_passes(a, b) summed as steps 9 and 10 (kernels/09_tf32_wgmma.cu) sum it on the
    tensor cores: per 8-deep wgmma, lo*hi, hi*lo and hi*hi each added exactly into an fp32
    accumulator that rounds toward zero (what the H200 was measured to do, kernels/09_tf32_wgmma.md); with
    run_chunks > 0 the accumulator starts afresh every run_chunks 32-deep chunks, and each run is
    added into an fp32 total that rounds to nearest (step 10's FADDs)."""
    (a_hi, a_lo), (b_hi, b_lo) = (tuple(x.double() for x in tf32_parts(t)) for t in (a, b))
    depth = a.shape[1]
    run_depth = 32 * run_chunks if run_chunks else depth
    total = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for run in range(0, depth, run_depth):
        acc = torch.zeros_like(total)
        for k in range(run, min(depth, run + run_depth), 8):
            step = slice(k, k + 8)
            for x, y in ((a_lo, b_hi), (a_hi, b_lo), (a_hi, b_hi)):
                acc = toward_zero(acc + x[:, step] @ y[step])
        total = (total + acc).float().double()
    return total.float()


def tolerance(fn: object, dtype: torch.dtype) -> float:
    if dtype == torch.float32 and getattr(fn, "fp32_math", "fp32") == "tf32":
        return TF32_TOLERANCE
    return TOLERANCE[dtype]

# Beyond the toy: one token, odd and prime sizes, rank 1, head_dim 1, H = 1, d_model = 1,
# thousands of tokens, sizes that are no multiple of a tile or of 4, and the real model widths.
SHAPE_MATRIX: tuple[Shape, ...] = (
    Shape(4, 96, 256, 48, 4, 32),  # the toy
    Shape(1, 1, 256, 48, 4, 32),  # a single token
    Shape(1, 3, 257, 33, 1, 7),  # odd everything, one head
    Shape(2, 5, 129, 1, 2, 3),  # rank 1
    Shape(1, 7, 64, 17, 3, 1),  # head_dim 1
    Shape(1, 17, 1, 5, 2, 4),  # d_model 1
    Shape(3, 37, 300, 50, 5, 13),
    Shape(1, 129, 512, 96, 6, 24),
    Shape(1, 1000, 96, 24, 2, 16),
    Shape(2, 1537, 128, 64, 8, 16),  # 3074 tokens
    Shape(1, 4096, 256, 48, 4, 32),  # toy widths, many tokens
    Shape(1, 300, 520, 132, 7, 19),
    V2_LITE.with_tokens(1, 8),
    V3.with_tokens(1, 2),
    STEP6_CLUSTER := Shape(1, 130, 64, 136, 2, 64),  # step 6: two blocks share a latent tile; a token tail
    Shape(1, 8500, 64, 264, 2, 64),  # step 6: 67 token tiles, so each block computes 3 latent tiles
    # step 6: 4 token tiles x 8 clusters of 2, which split 3 latent tiles through global memory
    STEP6_EXCHANGE := Shape(1, 400, 64, 264, 16, 64),
    # step 6: 16 blocks on one token tile split GEMM 1 along d_model too: 3 latent tiles (the last
    # 8 wide) in 5 parts each of 7 chunks (the last part 4, its last chunk 16 deep), the parts'
    # sums rounded by the last to arrive; the 16th block makes no part
    STEP6_SPLIT := Shape(1, 37, 2000, 264, 16, 64),
    # step 11: d_model split over a cluster of 3 with a short last part, 64-token tiles with a
    # tail, and the k|v boundary inside a 32-column tile
    STEP11_SPLIT := Shape(1, 70, 1000, 72, 3, 40),
    # step 12: 7 tokens in the 8-token kernel, d_model split over a cluster of 6 (parts of at least
    # 512 rows) with a short last part, and the k|v boundary inside a 32-column block
    STEP12_SPLIT := Shape(1, 7, 2999, 72, 3, 40),
    # step 12: 10 bf16 tokens take GEMM 2 on wgmma in 64-column tiles; the rank's last box holds
    # 8 of its 64 depths (200 = 3 x 64 + 8) and the latent's 16 rows hold 10 tokens
    STEP12_WGMMA := Shape(2, 5, 520, 200, 3, 64),
)

# Small shapes for slow checkers (compute-sanitizer): one token, odd sizes, rank 1, hd 1, D 1, and
# those that take step 6's cluster, exchange and split paths, steps 11 and 12's splits and step 12's
# wgmma.
QUICK_SHAPES = (*SHAPE_MATRIX[1:7], STEP6_CLUSTER, STEP6_EXCHANGE, STEP6_SPLIT, STEP11_SPLIT, STEP12_SPLIT,
                STEP12_WGMMA)


@dataclass
class Verdict:
    shape: Shape
    dtype: torch.dtype
    rel_error: float
    max_abs_error: float
    problem: str = ""  # empty when correct

    @property
    def ok(self) -> bool:
        return not self.problem

    def __str__(self) -> str:
        where = f"{self.shape.label()} {dtype_name(self.dtype)}"
        if self.ok:
            return f"ok    {where}: rel. error {self.rel_error:.1e}"
        return f"WRONG {where}: {self.problem}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compare(
    out: object, expected: torch.Tensor, dtype: torch.dtype, shape: Shape, limit: float | None = None
) -> Verdict:
    """Judge one output against the float64 reference (within `limit`, by default the dtype's)."""
    limit = TOLERANCE[dtype] if limit is None else limit

    def wrong(problem: str, rel: float = float("inf"), max_abs: float = float("inf")) -> Verdict:
        return Verdict(shape, dtype, rel, max_abs, problem)

    if not isinstance(out, torch.Tensor):
        return wrong(f"returned {type(out).__name__}, not a tensor")
    if tuple(out.shape) != shape.out_shape:
        return wrong(f"output shape {tuple(out.shape)}, expected (B, S, 2, H, hd) = {shape.out_shape}")
    if out.dtype != dtype:
        return wrong(f"output dtype {dtype_name(out.dtype)}, but the inputs are {dtype_name(dtype)}")
    if out.device != expected.device:
        return wrong(f"output on {out.device}, but the inputs are on {expected.device}")
    got = out.to(torch.float64)
    finite = torch.isfinite(got)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        first = _index(shape, int((~finite).flatten().nonzero()[0]))
        where = failure_map.describe(got, expected, shape, limit)
        return wrong(
            f"{bad} of {got.numel()} elements are NaN or Inf, first at out{first}: elements left "
            f"unwritten (the output was NaN-poisoned) or an overflow; {where}"
        )
    diff = got - expected
    rel = float(diff.norm() / expected.norm().clamp_min(1e-300))
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    if rel <= limit:
        return Verdict(shape, dtype, rel, max_abs)
    where = failure_map.describe(got, expected, shape, limit)
    return wrong(diagnose(got, expected, shape, limit) + (f"; {where}" if where else ""), rel, max_abs)


def diagnose(got: torch.Tensor, expected: torch.Tensor, shape: Shape, tolerance: float) -> str:
    """Name the mistake behind a wrong (but finite) output."""

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return float((a - b).norm() / b.norm().clamp_min(1e-300)) <= tolerance

    rel = float((got - expected).norm() / expected.norm().clamp_min(1e-300))
    if not bool(got.any()):
        return "the output is all zeros"
    if shape.heads > 1 or shape.head_dim > 1:
        if close(got.flip(2), expected):
            return "k and v are swapped: out[:, :, 0] must be k and out[:, :, 1] must be v"
        per_head = got.reshape(shape.batch, shape.seq, shape.heads, 2, shape.head_dim).transpose(2, 3)
        if shape.heads > 1 and close(per_head, expected):
            return "heads laid out as (B, S, H, 2, hd); the stacked output is (B, S, 2, H, hd)"
    k_ok = close(got[:, :, 0], expected[:, :, 0])
    v_ok = close(got[:, :, 1], expected[:, :, 1])
    if k_ok != v_ok:
        return f"{'k' if k_ok else 'v'} is right but {'v' if k_ok else 'k'} is wrong (rel. error {rel:.1e})"
    flat_got, flat_expected = got.flatten(), expected.flatten()
    error = (flat_got - flat_expected).abs()
    first = int((error >= 0.5 * error.max()).nonzero()[0])  # the first of the worst elements
    return (
        f"rel. error {rel:.1e} > {tolerance:.0e}; first wrong element out{_index(shape, first)}: "
        f"got {float(flat_got[first]):.6g}, expected {float(flat_expected[first]):.6g}"
    )


def _index(shape: Shape, flat: int) -> list[int]:
    index = []
    for size in reversed(shape.out_shape):
        index.append(flat % size)
        flat //= size
    return index[::-1]


def accepts_out(fn: Callable) -> bool:
    """Course kernels write into a given `out`; arbitrary callables (the reference) allocate."""
    return getattr(fn, "writes_into_out", False)


def run_poisoned(fn: Callable, inputs: Inputs, heads: int, shape: Shape, trial: int = 0) -> object:
    """Call fn so that any element it fails to write is NaN.

    A course kernel writes into a NaN-filled `out` on even trials and allocates its own output on
    odd ones. For the allocating path, a NaN-filled block of the right size is freed just before
    the call, so an `empty` left unfilled most likely hands back NaNs, not an earlier result.
    """
    poisoned = torch.full(
        shape.out_shape, float("nan"), dtype=inputs.hidden.dtype, device=inputs.hidden.device
    )
    if accepts_out(fn) and trial % 2 == 0:
        return fn(*inputs, heads, out=poisoned)
    del poisoned
    return fn(*inputs, heads)


def check(
    fn: Callable,
    shape: Shape,
    dtype: torch.dtype,
    device: str | torch.device,
    trials: int = 2,
    seed: int | None = None,
) -> Verdict:
    """Check fn on `trials` fresh random inputs of one shape; the worst trial is the verdict."""
    base = _fresh_seed() if seed is None else seed
    worst: Verdict | None = None
    for trial in range(trials):
        inputs = make_inputs(shape, dtype, device, seed=base + trial)
        out = run_poisoned(fn, inputs, shape.heads, shape, trial)
        verdict = compare(out, oracle(inputs, shape.heads), dtype, shape, tolerance(fn, dtype))
        if not verdict.ok:
            verdict.problem += f" (inputs: make_inputs(shape, {dtype}, seed={base + trial}))"
            return verdict
        if worst is None or verdict.rel_error > worst.rel_error:
            worst = verdict
    return worst


def check_matrix(
    fn: Callable,
    device: str | torch.device,
    shapes: Iterable[Shape] = SHAPE_MATRIX,
    dtypes: Iterable[torch.dtype] = (torch.float32, torch.bfloat16),
    trials: int = 2,
    seed: int | None = None,
) -> list[Verdict]:
    base = _fresh_seed() if seed is None else seed
    return [
        check(fn, shape, dtype, device, trials, seed=base + 1000 * i)
        for i, (shape, dtype) in enumerate((s, d) for s in shapes for d in dtypes)
    ]


def summary(verdicts: list[Verdict]) -> str:
    """One line: how many checks passed, and the worst error per dtype."""
    worst = {}
    for v in verdicts:
        name = dtype_name(v.dtype)
        worst[name] = max(worst.get(name, 0.0), v.rel_error)
    errors = ", ".join(f"{error:.1e} {name}" for name, error in worst.items())
    return f"{sum(v.ok for v in verdicts)}/{len(verdicts)} checks passed, worst rel. error {errors}"


def _fresh_seed() -> int:
    """A new seed per run, so no kernel can be tuned to one fixed set of inputs."""
    return int.from_bytes(os.urandom(4), "little")
