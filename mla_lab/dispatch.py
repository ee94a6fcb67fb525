"""One entry point for the whole course: `mla_lab.project(hidden, w_down, w_up_k, w_up_v, heads)`
runs the step that is fastest for the shape, dtype and GPU, keeping the dtype's accuracy (fp32 in,
fp32's tolerance out: never a one-pass TF32 step).

The rules are read off the sweep (`results/h100_80gb_hbm3.json`, graph replay), written once here,
and held to it by tests/test_dispatch.py: at every point of the newest sweep of that device, the
chosen step must be the fastest course step there, or within `SLACK` of it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from . import build, steps

# Up to this many tokens, step 11 (decode) beats the steps built for prefill (6 in bf16, 10 in fp32);
# in bf16 also only up to this many output elements: its 32-column blocks stream every token tile,
# and at V3's 32,768 columns and 64 tokens step 6 is faster. (Step 6 splits GEMM 1 along d_model
# for a few tokens: in the H100 sweep of sources ff03de2abf1d it took 16.1 µs at V2-Lite 64 tokens
# against step 11's 20.0, and 15.1 at 16 tokens against 11.3.)
DECODE_TOKENS = {torch.bfloat16: 32, torch.float32: 32}
# Up to this many tokens, step 12 (the weights streamed into FFMA, or in bf16 into mma.sync and
# wgmma) beats step 11. In the H100 sweep of sources c9462df851e9, V2-Lite, µs: bf16 6.2 against
# 9.7 at 1 token, 6.5 against 10.7 at 5, 6.6 against 11.4 at 16; fp32 10.2 against 17.5 at 1,
# 12.4 against 18.0 at 5, 15.6 against 19.1 at 16. Past 16 bf16 tokens both GEMMs run on wgmma in
# token tiles, ahead of step 6 up to their limit of 512: V2-Lite 64 / 128 / 256 / 512 tokens 7.4 /
# 9.3 / 12.3 / 19.9 µs against 15.8 / 17.9 / 20.1 / 22.4, V3-TP8 64 11.7 against 20.4, V3 64 25.4
# against 30.1; only V3-TP8 300 is behind, 25.8 against 24.4 (inside SLACK).
WEIGHT_STREAM_TOKENS = {torch.bfloat16: 512, torch.float32: 16}
# fp32 batches step 12 also takes as one 64-token tile on mma.sync (three TF32 passes, the weights
# read as they lie), ahead of step 10, which transposes them on every call. The same sweep at 64
# tokens, µs: V2-Lite 29.7 against 39.2, V3-TP8 51.4 against 68.7, V3 92.1 against 193.6. From 17
# to 32 tokens step 11 keeps them: the tile computes 64 tokens whatever the count, so it is expected
# near those 29.7 µs at V2-Lite, above step 11's 19.1 at 16 (the sweep has no point there). Given
# weights prepared in its layout, step 10 beats the tile: at 64 tokens V2-Lite 25.3 against 29.7 µs,
# V3-TP8 36.4 against 51.4, V3 84.3 against 92.1.
FP32_TILE_TOKENS = range(33, 65)
DECODE_OUTPUTS = {torch.bfloat16: 64 * 4096, torch.float32: None}
# In fp32, step 10 (k split over blocks for few tokens) overtakes step 11 between 16 and 64 tokens,
# with its weights prepared or not: in an H100 run of commit 666e626, prepared, 27.0 against 18.9 µs
# at V2-Lite 16 tokens and 28.3 against 44.0 at 64; at V3 64 tokens 87.2 against 233.3.
PREPARED_STEP = 10  # the one step whose layout `prepare` makes
SLACK = 1.10  # a chosen step may be this much slower than the fastest: run-to-run spread, untuned edges
RULES_FROM = "h100_80gb_hbm3"


@functools.cache
def _kernel(number: int) -> steps.Kernel:
    return steps.load(number)


def _on_hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


def widest_step(rank: int) -> int:
    """For latent widths past 512, where the tensor-core steps' tiles end: the fastest of the first
    steps whose launch limit takes `rank` (step 4 to 640, step 2 while a latent row fits its shared
    memory, step 1 always)."""
    return next(n for n in (4, 2, 1) if steps.get(n).max_rank is None or rank <= steps.get(n).max_rank)


def rule(tokens: int, rank: int, width: int, dtype: torch.dtype, on_hopper: Callable[[], bool],
         takes: Callable[[int], bool], prepared: bool = False) -> int:
    """The step the rules pick, from the sizes (width: heads * head_dim), the dtype, whether the GPU
    is a Hopper one, `takes(n)`: whether step n's own kernel takes the inputs (asked of steps 8 and
    12 only), and whether the weights come prepared in step 10's layout. `choose` asks the GPU and
    the kernels; tests/test_dispatch.py reads the answers off a sweep."""
    if rank > 512:
        return widest_step(rank)
    if not on_hopper():
        return 5 if dtype == torch.bfloat16 else 4
    if takes(8):
        return 8  # the toy's widths: every operand fits one block
    fp32_tile = dtype == torch.float32 and tokens in FP32_TILE_TOKENS and not prepared
    streamed = tokens <= WEIGHT_STREAM_TOKENS.get(dtype, 0) or fp32_tile
    if streamed and takes(12):
        return 12
    outputs = DECODE_OUTPUTS.get(dtype)
    if tokens <= DECODE_TOKENS.get(dtype, 0) and (outputs is None or tokens * 2 * width <= outputs):
        return 11
    return 6 if dtype == torch.bfloat16 else 10


def choose(hidden: torch.Tensor, w_down: torch.Tensor, w_up_k: torch.Tensor, w_up_v: torch.Tensor,
           prepared: bool = False) -> int:
    """The step number `project` runs for these inputs (on their GPU), given the weights prepared
    or not."""
    tokens = hidden.numel() // hidden.shape[-1] if hidden.dim() else 0
    return rule(tokens, w_down.shape[-1], w_up_k.shape[-1], hidden.dtype, lambda: _on_hopper(hidden.device),
                lambda number: _kernel(number).takes_fast_path(hidden, w_down, w_up_k, w_up_v), prepared)


def has_layout_to_prepare(w_down: torch.Tensor) -> bool:
    """Whether project may run a step with a layout of its own on these weights: step 10, for fp32
    on Hopper with rank <= 512."""
    return w_down.dtype == torch.float32 and w_down.shape[-1] <= 512 and _on_hopper(w_down.device)


def prepare(w_down: torch.Tensor, w_up_k: torch.Tensor, w_up_v: torch.Tensor, heads: int) -> steps.PreparedWeights | None:
    """The weights prepared once, for every later `project(..., prepared=...)` on them: in step 10's
    layout where project may run step 10; elsewhere None, as no step project runs there reads the
    weights in a layout of its own."""
    build.require_gpu()
    return _kernel(PREPARED_STEP).prepare(w_down, w_up_k, w_up_v, heads) if has_layout_to_prepare(w_down) else None


def project(
    hidden: torch.Tensor,
    w_down: torch.Tensor,
    w_up_k: torch.Tensor,
    w_up_v: torch.Tensor,
    heads: int,
    out: torch.Tensor | None = None,
    prepared: steps.PreparedWeights | None = None,
) -> torch.Tensor:
    """The stacked (B, S, 2, H, hd) projection by the course's fastest step for these inputs; with
    `prepared` (what `prepare` returned for these weights) by the fastest given prepared weights."""
    build.require_gpu()
    kernel = _kernel(choose(hidden, w_down, w_up_k, w_up_v, prepared is not None))
    if prepared is not None and prepared.step != kernel.step:  # a step that reads the weights as they are
        prepared.check_made_for(prepared.step, w_down, w_up_k, w_up_v, heads)  # still: these very weights
        prepared = None
    return kernel(hidden, w_down, w_up_k, w_up_v, heads, out=out, prepared=prepared)


# The harness may hand it a NaN-poisoned output, and holds fp32 to fp32's tolerance.
project.writes_into_out = True
project.fp32_math = "fp32"
NAME = "mla_lab.project"
PREPARED_NAME = "mla_lab.project prepared"
