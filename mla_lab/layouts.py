"""Which thread holds which element: the register layouts of the tensor-core instructions the
kernels use, and the shared-memory layouts they read, as plain functions (no GPU, no LaTeX).

They follow the PTX ISA's figures for `mma.sync.m16n8k16` (bf16), `mma.sync.m16n8k8` (tf32),
`ldmatrix.x4`, the `wgmma` fp32 accumulator, and TMA's 128-byte swizzle. tests/test_layouts.py
checks them against the index expressions the kernels themselves use (step 5's ldmatrix
addresses and result pairs, step 6's accumulator walk), so a picture drawn from them is the
layout the course's code relies on. mla_lab.plots.fragment draws them.
"""

from __future__ import annotations

from collections.abc import Callable

Element = tuple[int, int]  # (row, column) in the tile


def mma_bf16_a(lane: int, register: int) -> list[Element]:
    """m16n8k16 A (16 x 16, row-major): the two bf16 in 32-bit register 0..3 of a lane."""
    group, pair = lane // 4, lane % 4
    row = group + 8 * (register % 2)
    column = 2 * pair + 8 * (register // 2)
    return [(row, column), (row, column + 1)]


def mma_bf16_b(lane: int, register: int) -> list[Element]:
    """m16n8k16 B (16 x 8, as k x n): the two bf16 in register 0..1 of a lane."""
    group, pair = lane // 4, lane % 4
    k = 2 * pair + 8 * register
    return [(k, group), (k + 1, group)]


def mma_tf32_a(lane: int, register: int) -> list[Element]:
    """m16n8k8 A (16 x 8, tf32): the one element in register 0..3 of a lane."""
    group, pair = lane // 4, lane % 4
    return [(group + 8 * (register % 2), pair + 4 * (register // 2))]


def mma_tf32_b(lane: int, register: int) -> list[Element]:
    """m16n8k8 B (8 x 8 as k x n, tf32): the one element in register 0..1 of a lane."""
    group, pair = lane // 4, lane % 4
    return [(pair + 4 * register, group)]


def mma_c(lane: int, register: int) -> list[Element]:
    """The fp32 accumulator of both shapes (16 x 8): the one element in register 0..3 of a lane."""
    group, pair = lane // 4, lane % 4
    return [(group + 8 * (register // 2), 2 * pair + register % 2)]


def ldmatrix_x4(row_of_lane: Callable[[int], Element]) -> Callable[[int, int], list[Element]]:
    """What `ldmatrix.x4` (16-bit elements) hands each lane: lanes 8j..8j+7 give the (row, column)
    where the 8 rows of matrix j start; lane l receives, in register j, elements 2 (l % 4) and
    2 (l % 4) + 1 of row l / 4 of matrix j."""

    def received(lane: int, register: int) -> list[Element]:
        row, column = row_of_lane(8 * register + lane // 4)
        return [(row, column + 2 * (lane % 4)), (row, column + 2 * (lane % 4) + 1)]

    return received


def wgmma_accumulator(thread: int, index: int) -> Element:
    """`wgmma.m64nNk16` fp32 accumulator: element `index` of a warpgroup thread (0..127). Each
    warp owns 16 rows; index i covers columns 8 (i / 4) + 2 (lane % 4) + i % 2, rows + 8 (i / 2 % 2)."""
    warp, lane = thread // 32, thread % 32
    return (warp * 16 + lane // 4 + 8 * (index // 2 % 2), 8 * (index // 4) + 2 * (lane % 4) + index % 2)


def swizzle_128b(row: int, byte: int) -> int:
    """TMA's 128-byte swizzle: where byte `byte` of row `row` of a box with 128-byte rows lands.
    The 16-byte chunk index within the row is XORed with the row's index modulo 8, so the 8 rows
    of a chunk column fall in 8 different groups of 4 banks."""
    chunk, within = divmod(byte, 16)
    return row * 128 + 16 * (chunk ^ (row % 8)) + within


def bank_conflicts(word_addresses: list[int]) -> int:
    """How many passes one warp-wide access of 32 4-byte words takes: its most shared bank's count
    of distinct words (lanes reading the same word share a pass)."""
    banks: dict[int, set[int]] = {}
    for address in word_addresses:
        banks.setdefault(address % 32, set()).add(address)
    return max(len(words) for words in banks.values())


FRAGMENTS = {
    "mma.sync m16n8k16 A (bf16)": (mma_bf16_a, 16, 16, 4),
    "mma.sync m16n8k16 B (bf16)": (mma_bf16_b, 16, 8, 2),
    "mma.sync m16n8k8 A (tf32)": (mma_tf32_a, 16, 8, 4),
    "mma.sync m16n8k8 B (tf32)": (mma_tf32_b, 8, 8, 2),
    "mma.sync C (fp32)": (mma_c, 16, 8, 4),
}


def owners(layout: Callable[[int, int], list[Element]], rows: int, columns: int, registers: int
           ) -> dict[Element, tuple[int, int]]:
    """(row, column) -> (lane, register) for a fragment layout; raises if it is not one-to-one."""
    held: dict[Element, tuple[int, int]] = {}
    for lane in range(32):
        for register in range(registers):
            for element in layout(lane, register):
                if element in held or not (0 <= element[0] < rows and 0 <= element[1] < columns):
                    raise ValueError(f"lane {lane} register {register}: {element} is outside or taken")
                held[element] = (lane, register)
    if len(held) != rows * columns:
        raise ValueError(f"{len(held)} of {rows * columns} elements are held")
    return held
