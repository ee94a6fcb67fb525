"""Where a wrong output is wrong, in one line: which elements, in k or v, which heads, columns and
tokens, and whether they were never written (still NaN from the poisoned output) or hold wrong
values. A learner with k and v swapped in one head and one with no tail guard see different lines.

    wrong on 25 % of elements (wrong values): v only, all 4 heads, columns 16-31 of each head,
    all 384 tokens
"""

from __future__ import annotations

import torch

from .problem import Shape

# An element is wrong when it is off by more than this many times the tolerance, in units of the
# reference's root mean square: far looser than the check's norm, so that only the elements a bug
# touched are counted, not the rounding spread over all of them.
ELEMENT_SLACK = 8.0


def wrong_elements(got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> torch.Tensor:
    """A boolean (B, S, 2, H, hd) mask: not finite, or off by more than the slack allows."""
    scale = float(expected.double().pow(2).mean().sqrt()) or 1.0
    error = (got.double() - expected.double()).abs()
    return ~torch.isfinite(got) | (error > ELEMENT_SLACK * tolerance * scale)


def ranges(indices: list[int], limit: int = 3) -> str:
    """[0, 1, 2, 5, 6] as "0-2, 5-6"; more than `limit` runs as "N scattered"."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    if len(runs) > limit:
        return f"{len(indices)} scattered"
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _which(mask_along: torch.Tensor, size: int, noun: str, plural: str) -> str:
    hit = [int(i) for i in mask_along.nonzero().flatten()]
    if len(hit) == size:
        return f"all {size} {plural}" if size > 1 else f"the {noun}"
    return f"{noun if len(hit) == 1 else plural} {ranges(hit)}"


def describe(got: torch.Tensor, expected: torch.Tensor, shape: Shape, tolerance: float) -> str | None:
    """One line saying where `got` is wrong, or None if no element is (the error is spread thin)."""
    mask = wrong_elements(got, expected, tolerance)
    count = int(mask.sum())
    if count == 0:
        return None
    unwritten = int((~torch.isfinite(got) & mask).sum())
    if unwritten == count:
        kind = "never written (still NaN)"
    elif unwritten == 0:
        kind = "wrong values"
    else:
        kind = f"{unwritten} never written, the rest wrong values"
    k, v = bool(mask[:, :, 0].any()), bool(mask[:, :, 1].any())
    halves = "k and v" if k and v else ("k only" if k else "v only")
    heads = _which(mask.any(dim=(0, 1, 2, 4)), shape.heads, "head", "heads")
    columns = _which(mask.any(dim=(0, 1, 2, 3)), shape.head_dim, "column", "columns")
    positions = _which(mask.any(dim=(0, 2, 3, 4)), shape.seq, "position", "positions")
    batches = mask.any(dim=(1, 2, 3, 4))
    where = f"{positions} of every sequence" if bool(batches.all()) else \
        f"{_which(batches, shape.batch, 'sequence', 'sequences')}, {positions}"
    share = 100.0 * count / mask.numel()
    return (f"wrong on {share:.3g} % of elements ({count} of {mask.numel()}, {kind}): {halves}, {heads}, "
            f"{columns} of each head, {where}")
