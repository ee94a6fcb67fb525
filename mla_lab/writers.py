"""Which block, warp and lane wrote each output element, under a step's launch geometry: the last
clause of the grader's failure line ("written by warp 1 of every block"), for the steps whose
geometry is one formula of the output index (steps 1 to 5 so far).

A mistake in a kernel's indexing usually falls on a pattern of threads, not of heads or tokens: a
warp that offsets into the wrong half, a last block that misses its tail. Said in threads, it
points at the line to read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .failure_map import ranges
from .problem import Shape

WARP = 32
# Threads per block of the steps whose block size is fixed.
THREADS = {1: 256, 2: 256, 3: 256, 4: 512}
# Step 5's tiles (solutions/05_tensor_cores.cu: Config<T, tokens, columns, warps down, warps across>),
# from the most reuse of a staged slice to the most blocks; the first that suits the launch runs.
TENSOR_CORE_TILES = ((64, 256, 2, 8), (32, 128, 1, 4), (16, 64, 1, 4))
KNOWN_STEPS = (*THREADS, 5)
# Step 5's threads compute their results in mma's accumulator layout and store them through
# shared memory: its clause names the threads whose fragments held the wrong values.
VERB = {5: "computed by"}


@dataclass(frozen=True)
class Gpu:
    """What a step's launch plan reads of the GPU."""
    multiprocessors: int
    shared_bytes_optin: int  # the most shared memory one block may opt in to

    @classmethod
    def current(cls) -> Gpu:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return cls(props.multi_processor_count, props.shared_memory_per_block_optin)


def tensor_core_tile(shape: Shape, dtype: torch.dtype, gpu: Gpu) -> tuple[int, int, int, int]:
    """The tile step 5 launches for this shape on this GPU (its `launch` and `suits`): the first
    that still gives every SM a block and whose latent tile fits beside two staged slices."""
    size = dtype.itemsize
    slice_depth, pad_a, pad_b = 128 // size, 8 if size == 2 else 4, 8
    for tile in TENSOR_CORE_TILES[:-1]:
        tokens, columns = tile[:2]
        latent = size * tokens * (math.ceil(shape.rank / columns) * columns + pad_a)
        stage = size * (tokens * (slice_depth + pad_a) + slice_depth * (columns + pad_b))
        blocks = math.ceil(shape.tokens / tokens) * math.ceil(2 * shape.width / columns)
        if blocks >= gpu.multiprocessors and gpu.shared_bytes_optin - latent >= 2 * stage:
            return tile
    return TENSOR_CORE_TILES[-1]


def thread_ids(step: int, shape: Shape, dtype: torch.dtype = torch.float32,
               gpu: Gpu | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(block, thread within its block) of the thread that writes (for step 5: computes) each
    (B, S, 2, H, hd) element; None for a step this module does not know, or step 5 without a GPU."""
    if step not in KNOWN_STEPS or (step == 5 and gpu is None):
        return None
    flat = torch.arange(shape.tokens * 2 * shape.width).reshape(shape.out_shape)
    if step == 1:  # one thread per element, in order (a grid-stride loop that never wraps at these sizes)
        return flat // THREADS[1], flat % THREADS[1]
    token, column = flat // (2 * shape.width), flat % (2 * shape.width)
    if step == 2:  # one block per token; its threads take the 2 * width columns in turn
        return token, column % THREADS[2]
    if step == 3:  # a block owns 32 tokens; warp w holds rows 4w .. 4w + 3 of them, lane l columns l, l + 32, ...
        return token // 32, token % 32 // 4 * WARP + column % WARP
    if step == 4:
        # a block owns 32 tokens (blockIdx.x) and takes 512-column tiles in turn (blockIdx.y, a split
        # that depends on the GPU's SM count, so the line leaves it out); warp w holds the tile's
        # columns 32w .. 32w + 31, lane l the tokens l / 8, l / 8 + 4, ... and 4 columns from 4 * (l % 8)
        return token // 32, column % 512 // 32 * WARP + token % 4 * 8 + column % 32 // 4
    # step 5: the warps split the block's tile into warps-down x warps-across parts; in each 16 x 8
    # mma tile, lane l holds rows l / 4 and l / 4 + 8, columns 2 * (l % 4) and the one after
    tokens, columns, warps_down, warps_across = tensor_core_tile(shape, dtype, gpu)
    row, column_in_tile = token % tokens, column % columns
    warp = row // (tokens // warps_down) * warps_across + column_in_tile // (columns // warps_across)
    return token // tokens, warp * WARP + row % 8 * 4 + column_in_tile % 8 // 2


def written_by(step: int, mask: torch.Tensor, shape: Shape, dtype: torch.dtype = torch.float32,
               gpu: Gpu | None = None) -> str | None:
    """"written by warp 1 of every block, all 32 lanes", or None for a step this module does not know."""
    ids = thread_ids(step, shape, dtype, gpu)
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
    return f"{VERB.get(step, 'written by')} {part(warp, 'warp', 'warps')} of {blocks}, {part(lane, 'lane', 'lanes')}"
