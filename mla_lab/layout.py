"""Memory layout of the stacked (B, S, 2, H, hd) output, and the GEMMs that write it directly."""

from __future__ import annotations

import itertools

import torch

from .problem import Shape


def stacked_strides(shape: Shape) -> tuple[int, ...]:
    """Element strides of the contiguous (B, S, 2, H, hd) output, computed by hand."""
    hd = shape.head_dim
    return (shape.seq * 2 * shape.width, 2 * shape.width, shape.width, hd, 1)


def stacked_offset(shape: Shape, b: int, s: int, kv: int, h: int, d: int) -> int:
    """Flat element offset of out[b, s, kv, h, d]: the dot product of index and strides."""
    return sum(i * st for i, st in zip((b, s, kv, h, d), stacked_strides(shape)))


def row_column(shape: Shape, kv: int, h: int, d: int) -> int:
    """Column of a token's row of 2 * width outputs: the stacked output is (tokens, 2 * width)."""
    return (kv * shape.heads + h) * shape.head_dim + d


def concat_weights(w_up_k: torch.Tensor, w_up_v: torch.Tensor) -> torch.Tensor:
    """[W_uk | W_uv], (rank, 2 * width): one GEMM against it yields the stacked row of a token."""
    return torch.cat([w_up_k, w_up_v], dim=1)


def per_head_weights(w_up_k: torch.Tensor, w_up_v: torch.Tensor, heads: int) -> torch.Tensor:
    """The same columns permuted for the (B, S, H, 2, hd) layout: [k_0 v_0 | k_1 v_1 | ...]."""
    rank, width = w_up_k.shape
    per_head = torch.stack([w_up_k.reshape(rank, heads, -1), w_up_v.reshape(rank, heads, -1)], 2)
    return per_head.reshape(rank, 2 * width)


def concat_projection(
    hidden: torch.Tensor, w_down: torch.Tensor, w_cat: torch.Tensor, heads: int, out: torch.Tensor,
    allow_tf32: bool = False,
) -> torch.Tensor:
    """The operator as two cuBLAS GEMMs, the second writing the stacked output in place: no stack.
    With allow_tf32, cuBLAS may run fp32 inputs on TF32 tensor cores (the sweep's "cuBLAS concat
    TF32"); the global setting is restored afterwards."""
    batch, seq, d_model = hidden.shape
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    try:
        latent = torch.mm(hidden.reshape(batch * seq, d_model), w_down)
        torch.mm(latent, w_cat, out=out.view(batch * seq, w_cat.shape[1]))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return out


def address_map(shape: Shape, tokens: int = 2) -> torch.Tensor:
    """For the first `tokens` tokens, the code of what lives at each flat offset of the output.

    code = kv * heads + h: k of head 0..H-1 then v of head 0..H-1. Shape (tokens, 2 * width), so
    row t of the picture is token t's contiguous stretch of memory.
    """
    codes = torch.arange(2 * shape.heads).repeat_interleave(shape.head_dim)
    return codes.expand(tokens, -1).clone()


def grade_offset_function(offset_fn, shapes: list[Shape]) -> str:
    """Check a learner's offset(shape, b, s, kv, h, d) against torch's own strides, element by element."""
    checked = 0
    for shape in shapes:
        probe = torch.empty(shape.out_shape)
        strides = probe.stride()
        for index in itertools.product(*(range(n) for n in shape.out_shape)):
            got = offset_fn(shape, *index)
            if got is NotImplemented or got is None:
                return "not implemented yet: fill in stacked_offset_exercise and run this cell again"
            expected = sum(i * st for i, st in zip(index, strides))
            if got != expected:
                return f"wrong: out{list(index)} of {shape.label()} is at offset {expected}, you gave {got}"
            checked += 1
    return f"correct on all {checked} elements of {len(shapes)} shapes"
