"""What TF32 rounding costs the projection, emulated on the CPU (no GPU needed): the relative
Frobenius error against float64 when each operand reaches the tensor cores rounded to nearest
TF32 (`cvt.rna`) or with its low 13 bits dropped, products summed exactly (float64), the latent
stored as fp32 in between. It predicts the error of step 9, which rounds the weights and the
latent (and, through its tensor map, hidden); and of step 10, where each operand is split into TF32
parts and each product is hi*hi + hi*lo + lo*hi (a product of two TF32 values is exact in fp32),
summed in fp32 rounding to nearest, against plain fp32 matmuls. Last, the three passes as the
tensor cores sum them: each 8-deep wgmma adds its exact partial sum into an fp32 accumulator
rounding toward zero, as measured on an H200, with and without step 10's fix (runs of 4 chunks,
128 deep, added into registers rounding to nearest).

    python -m mla_lab.rounding [TOKENS]   # V2-Lite widths, 256 tokens by default
"""
import sys

import torch

from mla_lab.check import tf32_round as rounded
from mla_lab.check import three_tf32_passes, three_tf32_passes_on_tensor_cores
from mla_lab.problem import V2_LITE, make_inputs


def truncated(t: torch.Tensor) -> torch.Tensor:
    """float32 values with the 13 low mantissa bits TF32 lacks dropped (toward zero)."""
    return (t.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def problem(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """V2-Lite's widths at `tokens`: hidden's rows, w_down, [w_up_k | w_up_v], and the float64 result."""
    shape = V2_LITE.with_tokens(1, tokens)
    hidden, w_down, w_up_k, w_up_v = make_inputs(shape, torch.float32, "cpu", seed)
    rows = hidden.reshape(-1, shape.d_model)
    w_cat = torch.cat([w_up_k, w_up_v], 1)
    return rows, w_down, w_cat, (rows.double() @ w_down.double()) @ w_cat.double()


def product_error(tokens: int, seed: int, matmul, second=None) -> float:
    """The relative error of (hidden @ w_down) @ [w_up_k | w_up_v] on fp32 inputs, GEMM 1 by
    `matmul` and GEMM 2 by `second` (by default `matmul` too), the latent fp32 in between."""
    rows, w_down, w_cat, exact = problem(tokens, seed)
    out = (second or matmul)(matmul(rows, w_down), w_cat).double()
    return float((out - exact).norm() / exact.norm())


def error(tokens: int, seed: int, hidden_as, weights_as, latent_as) -> float:
    """product_error with products summed exactly, each operand reaching them as `*_as` makes it."""

    def gemm1(a, b):
        return (hidden_as(a).double() @ weights_as(b).double()).float()

    def gemm2(a, b):
        return latent_as(a).double() @ weights_as(b).double()

    return product_error(tokens, seed, gemm1, gemm2)


# label -> how (hidden, the weights, the latent) reach the tensor cores
CASES = {
    "every operand rounded (step 5)": (rounded, rounded, rounded),
    "hidden truncated, the rest rounded": (truncated, rounded, rounded),
    "every operand truncated": (truncated, truncated, truncated),
}


def kernel_error(tokens: int, seed: int, promote_gemm1: int, promote_gemm2: int) -> float:
    """product_error for the three passes on the tensor cores, each GEMM with its own runs."""

    def in_runs(chunks: int):
        return lambda a, b: three_tf32_passes_on_tensor_cores(a, b, chunks)

    return product_error(tokens, seed, in_runs(promote_gemm1), in_runs(promote_gemm2))


# label -> (GEMM 1's, GEMM 2's) runs in chunks, 0 for none
KERNEL_SUMS = {
    "three passes, tensor-core sums, no runs (unpromoted)": (0, 0),
    "the same, GEMM 1 in runs of 4 chunks": (4, 0),
    "the same, both GEMMs in runs of 4 (step 10)": (4, 4),
}

PRODUCTS = {
    "three TF32 passes (step 10), summed to nearest": three_tf32_passes,
    "fp32 matmuls (as cuBLAS fp32 and step 4)": torch.matmul,
}


def main(argv: list[str]) -> int:
    tokens = int(argv[0]) if argv else 256
    rows = [*((label, lambda seed, r=r: error(tokens, seed, *r)) for label, r in CASES.items()),
            *((label, lambda seed, m=m: product_error(tokens, seed, m)) for label, m in PRODUCTS.items()),
            *((label, lambda seed, r=r: kernel_error(tokens, seed, *r)) for label, r in KERNEL_SUMS.items())]
    for label, error_at in rows:
        print(f"{label:52} " + "  ".join(f"{error_at(seed):.2e}" for seed in range(3)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
