"""Which block, warp and lane wrote each output element, under a step's launch geometry: the last
clause of the grader's failure line ("written by warp 1 of every block"), for the steps whose
geometry is one formula of the output index.

A mistake in a kernel's indexing usually falls on a pattern of threads, not of heads or tokens: a
warp that offsets into the wrong half, a last block that misses its tail. Said in threads, it
points at the line to read.
"""

from __future__ import annotations

import torch

from .failure_map import ranges
from .problem import Shape

WARP = 32
# Threads per block of the steps this module knows, and how each lays its threads on the output.
THREADS = {1: 256, 2: 256, 3: 256}


def thread_ids(step: int, shape: Shape) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(block, thread within its block) of the thread that writes each (B, S, 2, H, hd) element."""
    if step not in THREADS:
        return None
    flat = torch.arange(shape.tokens * 2 * shape.width).reshape(shape.out_shape)
    if step == 1:  # one thread per element, in order (a grid-stride loop that never wraps at these sizes)
        return flat // THREADS[1], flat % THREADS[1]
    token, column = flat // (2 * shape.width), flat % (2 * shape.width)
    if step == 2:  # one block per token; its threads take the 2 * width columns in turn
        return token, column % THREADS[2]
    # step 3: a block owns 32 tokens; warp w holds rows 4w .. 4w + 3 of them, lane l columns l, l + 32, ...
    return token // 32, token % 32 // 4 * WARP + column % WARP


def written_by(step: int, mask: torch.Tensor, shape: Shape) -> str | None:
    """"written by warp 1 of every block, all 32 lanes", or None for a step this module does not know."""
    ids = thread_ids(step, shape)
    if ids is None or not bool(mask.any()):
        return None
    block, thread = ids
    warp, lane = thread // WARP, thread % WARP

    def part(values: torch.Tensor, noun: str, plural: str) -> str:
        hit, every = sorted(set(values[mask].tolist())), sorted(set(values.flatten().tolist()))
        if hit == every:
            return f"all {len(every)} {plural}" if len(every) > 1 else f"the one {noun}"
        return f"{noun if len(hit) == 1 else plural} {ranges(hit)}"

    blocks = part(block, "block", "blocks")
    blocks = "every block" if blocks.startswith(("all ", "the one ")) else blocks
    return f"written by {part(warp, 'warp', 'warps')} of {blocks}, {part(lane, 'lane', 'lanes')}"
