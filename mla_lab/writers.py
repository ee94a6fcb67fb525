"""Which block, warp and lane wrote each output element, under a step's launch geometry: the last
clause of the grader's failure line ("written by warp 1 of every block"), for the steps whose
geometry is one formula of the output index and of the launch plan (every exercise's step).

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
KNOWN_STEPS = (*THREADS, 5, 6, 7, 8, 11)
PLANS_READ_THE_GPU = (5, 7, 8)  # SM count, shared memory per block
# Steps 5 and 6 compute their results in an mma accumulator layout and move them between threads
# (through shared memory, or shuffles) before storing: their clause names the threads whose
# fragments held the wrong values.
VERB = {5: "computed by", 6: "computed by"}
# Step 6's block numbers and which consumer warpgroup takes an output tile follow its cluster plan,
# which reads cudaOccupancyMaxActiveClusters on the kernel itself: its clause names a warp within a
# consumer warpgroup, and blocks by the 128-token tile they share.
HOPPER_TOKENS = 128


@dataclass(frozen=True)
class Gpu:
    """What a step's launch plan reads of the GPU."""
    multiprocessors: int
    shared_bytes_optin: int  # the most shared memory one block may opt in to

    @classmethod
    def current(cls) -> Gpu:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return cls(props.multi_processor_count, props.shared_memory_per_block_optin)


H100 = Gpu(multiprocessors=132, shared_bytes_optin=227 * 1024)  # the GPU of the stored results (SXM)


def token_and_column(shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Each (B, S, 2, H, hd) output element's token and its column among the token's 2 * H * hd."""
    flat = torch.arange(shape.tokens * 2 * shape.width).reshape(shape.out_shape)
    return flat // (2 * shape.width), flat % (2 * shape.width)


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
    (B, S, 2, H, hd) element; None for a step this module does not know, or without `gpu` for a
    step whose launch plan reads the GPU."""
    if step not in KNOWN_STEPS or (step in PLANS_READ_THE_GPU and gpu is None):
        return None
    token, column = token_and_column(shape)
    if step == 1:  # one thread per element, in order (a grid-stride loop that never wraps at these sizes)
        flat = token * 2 * shape.width + column
        return flat // THREADS[1], flat % THREADS[1]
    if step == 2:  # one block per token; its threads take the 2 * width columns in turn
        return token, column % THREADS[2]
    if step == 3:  # a block owns 32 tokens; warp w holds rows 4w .. 4w + 3 of them, lane l columns l, l + 32, ...
        return token // 32, token % 32 // 4 * WARP + column % WARP
    if step == 4:
        # a block owns 32 tokens (blockIdx.x) and takes 512-column tiles in turn (blockIdx.y, a split
        # that depends on the GPU's SM count, so the line leaves it out); warp w holds the tile's
        # columns 32w .. 32w + 31, lane l the tokens l / 8, l / 8 + 4, ... and 4 columns from 4 * (l % 8)
        return token // 32, column % 512 // 32 * WARP + token % 4 * 8 + column % 32 // 4
    if step == 5:
        # the warps split the block's tile into warps-down x warps-across parts; in each 16 x 8 mma
        # tile, lane l holds rows l / 4 and l / 4 + 8, columns 2 * (l % 4) and the one after
        tokens, columns, warps_down, warps_across = tensor_core_tile(shape, dtype, gpu)
        row, column_in_tile = token % tokens, column % columns
        warp = row // (tokens // warps_down) * warps_across + column_in_tile // (columns // warps_across)
        return token // tokens, warp * WARP + _accumulator_lane(row, column_in_tile)
    if step == 6:
        if not hopper_takes(shape, dtype):
            return None  # the binding runs step 5 there, not the exercise's kernel
        # warp w of the consumer warpgroup holds rows 16w .. 16w + 15 of its 64; in each 8-column
        # group of wgmma's accumulator, lane l holds rows l / 4 and l / 4 + 8, columns 2 * (l % 4), + 1
        return token // HOPPER_TOKENS, token % 64 // 16 * WARP + _accumulator_lane(token, column)
    if step == 7:
        # a block owns 8 tokens (blockIdx.x; its column split, blockIdx.y, is left out); at the end
        # of each GEMM 2 pass its 512 threads take the pass's (token, column) results in turn
        pass_width = latency_pass_width(shape, gpu)
        return token // 8, (token % 8 * pass_width + column % pass_width) % 512
    if step == 8:
        # `splits` blocks per 16-token tile, each a slice of [k | v]; warp w stores the slice's
        # 8-column mma tiles w, w + 8, ... straight from its accumulators
        splits = bulk_mma_splits(shape, gpu)
        slice_width = 2 * shape.width // splits
        in_slice = column % slice_width
        return token // 16 * splits + column // slice_width, in_slice // 8 % 8 * WARP + _accumulator_lane(token, in_slice)
    # step 11: GEMM 2's blocks each own 32 columns (blockIdx.x); for each token tile the threads take
    # its (row, 4-column group) pairs in turn, 8 groups to a row
    rows = decode_rows(shape, dtype)
    return column // 32, (token % rows * 8 + column % 32 // 4) % 256


def hopper_takes(shape: Shape, dtype: torch.dtype) -> bool:
    """Whether step 6's own kernel runs this shape (its `takes_fast_path`, on a Hopper GPU with
    16-byte aligned tensors)."""
    return (dtype == torch.bfloat16 and shape.d_model % 8 == 0 and shape.rank % 8 == 0 and shape.rank <= 512
            and shape.width % 64 == 0)


def _accumulator_lane(row: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """The lane holding (row, column) of a 16 x 8 mma accumulator tile: rows l / 4 and l / 4 + 8,
    columns 2 * (l % 4) and the one after."""
    return row % 8 * 4 + column % 8 // 2


def cheapest_column_split(slots: int, token_tiles: int, column_tiles: int, latent_work: float,
                          column_tile_work: float, max_splits: int) -> tuple[int, float]:
    """mla_common.cuh's cheapest_column_split: (splits, cost), the fewest waves of blocks times one
    block's work."""
    best = (1, 0.0)
    for splits in range(1, min(column_tiles, max_splits) + 1):
        cost = math.ceil(token_tiles * splits / slots) * (latent_work + column_tile_work * math.ceil(column_tiles / splits))
        if splits == 1 or cost < 0.999 * best[1]:
            best = (splits, cost)
    return best


def latency_pass_width(shape: Shape, gpu: Gpu) -> int:
    """Output columns per GEMM 2 pass of step 7 (its `choose_split`): the cheapest of 256 down to 32."""
    token_tiles, best, best_cost = math.ceil(shape.tokens / 8), 256, 0.0
    for width in (256, 128, 64, 32):
        _, cost = cheapest_column_split(gpu.multiprocessors, token_tiles, math.ceil(2 * shape.width / width),
                                        float(shape.d_model) * float(shape.rank), float(shape.rank) * width, 1024)
        if best_cost == 0.0 or cost < 0.999 * best_cost:
            best, best_cost = width, cost
    return best


def bulk_mma_splits(shape: Shape, gpu: Gpu) -> int:
    """Step 8's blocks per 16-token tile (its `plan`): the most, up to 8 and even, whose [k | v]
    slices are whole 8-column tiles and that still fit one wave."""
    tiles = math.ceil(shape.tokens / 16)
    fitting = [s for s in (4, 6, 8) if 2 * shape.width % (8 * s) == 0 and tiles * s <= gpu.multiprocessors]
    return max(fitting, default=2)


def decode_rows(shape: Shape, dtype: torch.dtype) -> int:
    """Tokens per tile of step 11's GEMM 2 (its `plan_of`): 64 once there are that many tokens and
    such a tile's ring fits 227 KB of shared memory beside the weight tile, else 16."""
    if shape.tokens < 64:
        return 16
    size, depth = dtype.itemsize, math.ceil(shape.rank / 16) * 16
    slot_depth = depth
    while True:
        for stages in (3, 2):
            needed = depth * 40 * size + stages * 64 * (slot_depth + 16 // size) * size + 2 * 64 * 40 * 4
            if needed <= 227 * 1024:
                return 64
        if slot_depth == 16:
            return 16
        slot_depth = math.ceil(slot_depth / 2 / 16) * 16


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

    if step == 6:
        blocks = part(block, "128-token tile", "128-token tiles")
        blocks = "a consumer warpgroup in " + (
            "every block" if blocks.startswith(("all ", "the one ")) else f"the blocks of {blocks}")
    else:
        blocks = part(block, "block", "blocks")
        blocks = "every block" if blocks.startswith(("all ", "the one ")) else blocks
    return f"{VERB.get(step, 'written by')} {part(warp, 'warp', 'warps')} of {blocks}, {part(lane, 'lane', 'lanes')}"
