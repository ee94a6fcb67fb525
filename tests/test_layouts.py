"""The layout functions the pictures draw, held to the index expressions the kernels use."""

import re

import matplotlib.pyplot as plt
import pytest

from mla_lab import layouts, plots
from mla_lab.steps import SOLUTIONS_DIR


def kernel_expression(path, pattern):
    """An index expression from a kernel's source, as Python (C's integer / becomes //)."""
    found = re.search(pattern, (SOLUTIONS_DIR / path).read_text())
    assert found, f"{path} no longer has {pattern!r}: update the layout it is checked against"
    return [group.replace(" / ", " // ") for group in found.groups()]


@pytest.mark.parametrize("name", layouts.FRAGMENTS)
def test_each_fragment_gives_every_element_of_its_tile_to_exactly_one_lane_and_register(name):
    layout, rows, columns, registers = layouts.FRAGMENTS[name]
    assert len(layouts.owners(layout, rows, columns, registers)) == rows * columns


def test_step_5s_ldmatrix_addresses_deliver_the_mma_a_fragment():
    (address,) = kernel_expression("05_tensor_cores.cu", r"const __nv_bfloat16\* row = tile \+ ([^;]+);")
    stride = 24  # any row pitch of at least 16 elements

    def row_of_lane(lane):
        return divmod(eval(address, {"lane": lane, "stride": stride}), stride)

    delivered = layouts.ldmatrix_x4(row_of_lane)
    for lane in range(32):
        for register in range(4):
            assert delivered(lane, register) == layouts.mma_bf16_a(lane, register), (lane, register)


def test_step_5s_result_pairs_are_the_mma_accumulator():
    row, column = kernel_expression(
        "05_tensor_cores.cu", r"const int row = warp_row \+ tm \* 16 \+ ([^,]+), column = warp_column \+ tn \* 8 \+ ([^;]+);")
    for lane in range(32):
        at = (eval(row, {"lane": lane}), eval(column, {"lane": lane}))
        assert [at, (at[0], at[1] + 1)] == layouts.mma_c(lane, 0) + layouts.mma_c(lane, 1)
        assert [(at[0] + 8, at[1]), (at[0] + 8, at[1] + 1)] == layouts.mma_c(lane, 2) + layouts.mma_c(lane, 3)


def test_step_6s_result_pairs_are_the_wgmma_accumulator():
    row, column = kernel_expression("06_hopper.cu", r"const int row = (warp \* 16 \+ lane / 4), column = ([^;]+);")
    for thread in range(128):
        names = {"warp": thread // 32 % 4, "lane": thread % 32}
        for i in range(16):  # 128 columns: 16 blocks of 8
            top = (eval(row, names), eval(column, {**names, "i": i}))
            held = [layouts.wgmma_accumulator(thread, 4 * i + k) for k in range(4)]
            assert held == [top, (top[0], top[1] + 1), (top[0] + 8, top[1]), (top[0] + 8, top[1] + 1)]


def test_the_128_byte_swizzle_spreads_a_chunk_column_over_every_bank_group():
    for chunk in range(8):
        offsets = [layouts.swizzle_128b(row, 16 * chunk) for row in range(8)]
        assert sorted(offset % 128 // 16 for offset in offsets) == list(range(8))
    assert layouts.bank_conflicts([row * 32 for row in range(8)]) == 8  # unswizzled: one bank, 8 passes
    assert layouts.bank_conflicts([layouts.swizzle_128b(row, 0) // 4 for row in range(8)]) == 1


@pytest.mark.parametrize("name", layouts.FRAGMENTS)
def test_every_fragment_can_be_drawn_without_a_gpu(name):
    figure = plots.fragment(name)
    assert figure.axes and figure.axes[0].get_title().startswith(name)
    plt.close(figure)
