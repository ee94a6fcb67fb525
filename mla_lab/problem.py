"""The operator: MLA's low-rank KV projection, its shapes, inputs, reference and cost counts.

hidden (B, S, D) -> latent = hidden.reshape(B*S, D) @ w_down (D, r)
                 -> k = latent @ w_up_k (r, H*hd), v = latent @ w_up_v (r, H*hd)
                 -> out = stack([k, v], dim=2) reshaped to (B, S, 2, H, hd)

H cannot be read off the weights (only H*hd can), so it is always an argument.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

ELEMENT_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float64: 8}


@dataclass(frozen=True)
class Shape:
    """One problem size. `tokens` = batch * seq is what the kernels see."""

    batch: int
    seq: int
    d_model: int
    rank: int
    heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value < (0 if field.name in ("batch", "seq") else 1):
                raise ValueError(f"Shape.{field.name} must be a positive integer, got {value!r}")

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def width(self) -> int:
        """Columns of each up-projection: heads * head_dim."""
        return self.heads * self.head_dim

    @property
    def out_shape(self) -> tuple[int, int, int, int, int]:
        return (self.batch, self.seq, 2, self.heads, self.head_dim)

    def with_tokens(self, batch: int, seq: int) -> Shape:
        return dataclasses.replace(self, batch=batch, seq=seq)

    def flops(self) -> int:
        """Useful floating-point operations: one down GEMM and two up GEMMs, 2 per multiply-add."""
        return 2 * self.tokens * self.rank * (self.d_model + 2 * self.width)

    def min_bytes(self, dtype: torch.dtype) -> int:
        """Fewest bytes any implementation moves: each input read once, the output written once."""
        elements = (
            self.tokens * self.d_model  # hidden
            + self.d_model * self.rank  # w_down
            + 2 * self.rank * self.width  # w_up_k, w_up_v
            + self.tokens * 2 * self.width  # out
        )
        return elements * ELEMENT_BYTES[dtype]

    def label(self) -> str:
        return (
            f"tokens={self.tokens} ({self.batch}x{self.seq}) D={self.d_model} r={self.rank} "
            f"H={self.heads} hd={self.head_dim}"
        )


# Model dimensions; batch and seq are chosen per use with Shape.with_tokens.
TOY = Shape(batch=4, seq=96, d_model=256, rank=48, heads=4, head_dim=32)
V2_LITE = Shape(batch=1, seq=4096, d_model=2048, rank=512, heads=16, head_dim=128)
V3 = Shape(batch=1, seq=4096, d_model=7168, rank=512, heads=128, head_dim=128)
# DeepSeek-V3 split 8 ways by tensor parallelism: each GPU owns 16 of the 128 heads.
V3_TP8 = Shape(batch=1, seq=4096, d_model=7168, rank=512, heads=16, head_dim=128)
PRESETS = {"toy": TOY, "v2_lite": V2_LITE, "v3": V3, "v3_tp8": V3_TP8}


def preset(name: str, batch: int | None = None, seq: int | None = None) -> Shape:
    """A named model size, optionally with another batch and sequence length."""
    try:
        shape = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
    return shape.with_tokens(batch or shape.batch, seq or shape.seq)


class Inputs(NamedTuple):
    hidden: torch.Tensor  # (B, S, D)
    w_down: torch.Tensor  # (D, r)
    w_up_k: torch.Tensor  # (r, H*hd)
    w_up_v: torch.Tensor  # (r, H*hd)


def make_inputs(
    shape: Shape,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> Inputs:
    """Seeded random inputs whose latent and outputs have entries of size about 1.

    Weights are scaled by 1/sqrt(fan-in), so every stage keeps unit variance: no overflow in bf16,
    no underflow hiding a wrong index. Drawn on the CPU in float32 so a seed means the same data
    on every device.
    """
    generator = torch.Generator().manual_seed(seed)

    def draw(*size: int, fan_in: int) -> torch.Tensor:
        values = torch.randn(*size, generator=generator) / fan_in**0.5
        return values.to(device=device, dtype=dtype)

    return Inputs(
        hidden=draw(shape.batch, shape.seq, shape.d_model, fan_in=1),
        w_down=draw(shape.d_model, shape.rank, fan_in=shape.d_model),
        w_up_k=draw(shape.rank, shape.width, fan_in=shape.rank),
        w_up_v=draw(shape.rank, shape.width, fan_in=shape.rank),
    )


def reference(
    hidden: torch.Tensor,
    w_down: torch.Tensor,
    w_up_k: torch.Tensor,
    w_up_v: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """The operator exactly as specified, in eager PyTorch: three matmuls and a stack."""
    batch, seq, d_model = hidden.shape
    head_dim = w_up_k.shape[1] // heads
    latent = hidden.reshape(batch * seq, d_model) @ w_down
    k = (latent @ w_up_k).reshape(batch, seq, heads, head_dim)
    v = (latent @ w_up_v).reshape(batch, seq, heads, head_dim)
    return torch.stack([k, v], dim=2)


def oracle(inputs: Inputs, heads: int) -> torch.Tensor:
    """The float64 reference on the inputs' own values: the yardstick every kernel is held to."""
    return reference(*(t.to(torch.float64) for t in inputs), heads=heads)
