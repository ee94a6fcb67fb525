"""The thread part of the failure line, on planted masks (mla_lab.writers)."""

import re

import pytest
import torch

from mla_lab import TOY, steps, writers
from mla_lab.grade import grade_file


def test_one_bad_warp_is_named_in_every_block():
    block, thread = writers.thread_ids(1, TOY)
    line = writers.written_by(1, thread // 32 == 1, TOY)
    assert line == "written by warp 1 of every block, all 32 lanes"


def test_a_missing_tail_is_the_last_block():
    block, thread = writers.thread_ids(2, TOY)
    mask = block == TOY.tokens - 1
    assert writers.written_by(2, mask, TOY) == f"written by all 8 warps of block {TOY.tokens - 1}, all 32 lanes"


def test_one_lane_in_step_2s_column_loop():
    shape = TOY.with_tokens(1, 3)
    block, thread = writers.thread_ids(2, shape)
    mask = thread % 32 == 5
    assert writers.written_by(2, mask, shape) == "written by all 8 warps of every block, lane 5"


def test_a_step_without_a_formula_says_nothing():
    assert writers.written_by(6, torch.ones(TOY.out_shape, dtype=torch.bool), TOY) is None
    assert writers.written_by(5, torch.ones(TOY.out_shape, dtype=torch.bool), TOY) is None  # its tile needs the GPU


def test_step_3s_warps_hold_rows_and_its_lanes_columns():
    block, thread = writers.thread_ids(3, TOY)
    # one row of every token tile, in every column: the rows of warp 2 (tokens 8-11 of each tile)
    token = torch.arange(TOY.tokens).reshape(TOY.batch, TOY.seq, 1, 1, 1).expand(TOY.out_shape)
    mask = (token % 32 >= 8) & (token % 32 < 12)
    assert writers.written_by(3, mask, TOY) == "written by warp 2 of every block, all 32 lanes"
    assert int(block.max()) == TOY.tokens // 32 - 1


def _token_and_column(shape):
    flat = torch.arange(shape.tokens * 2 * shape.width).reshape(shape.out_shape)
    return flat // (2 * shape.width), flat % (2 * shape.width)


def test_step_4s_warps_hold_columns_and_its_lanes_token_groups():
    token, column = _token_and_column(TOY)
    # warp 3 holds columns 96-127 of the 512-column tile; lanes 8-15 the tokens 1, 5, 9, ... of a tile
    mask = (column % 512 // 32 == 3) & (token % 4 == 1)
    assert writers.written_by(4, mask, TOY) == "written by warp 3 of every block, lanes 8-15"
    block, thread = writers.thread_ids(4, TOY)
    assert int(thread.max()) == 8 * 32 - 1  # TOY's 256 columns fill 8 of the 16 warps


def test_step_4s_formula_uses_the_kernels_own_geometry():
    """The constants writers.thread_ids assumes for step 4, read from the kernel's source."""
    source = (steps.REPO / "solutions" / "04_vectorized.cu").read_text()
    constant = {name: int(value) for name, value in re.findall(r"constexpr int (k\w+) = (\d+);", source)}
    assert (constant["kTokens"], constant["kColumns"], constant["kThreads"]) == (32, 512, writers.THREADS[4])
    assert (constant["kTokenGroups"], constant["kColumnGroups"]) == (4, 8)
    assert "kColumns / (kThreads / 32)" in source and "lane / kColumnGroups" in source


@pytest.mark.gpu
def test_the_grader_names_the_warp_and_lanes_of_a_planted_step_4_mistake(tmp_path):
    """ex04 with one mistake in warp 3, lanes 8-15: the failure line must say so."""
    source = (steps.REPO / "solutions" / "04_vectorized.cu").read_text()
    store = "        if (token >= p.tokens) break;\n"
    assert source.count(store) == 1
    planted = source.replace(store, store + "        if (threadIdx.x / 32 == 3 && threadIdx.x % 32 / 8 == 1) acc[i][j][0] += 1.0f;\n")
    path = tmp_path / "04_vectorized.cu"
    path.write_text(planted)
    result = grade_file(path, "ex04", quiet=True)
    assert result.status == "wrong" and "warp 3 of" in result.line and "lanes 8-15" in result.line, result.line


H100 = writers.Gpu(multiprocessors=132, shared_bytes_optin=227 * 1024)
A100 = writers.Gpu(multiprocessors=108, shared_bytes_optin=163 * 1024)


def test_step_5s_tile_is_the_one_its_launch_chooses():
    from mla_lab.problem import V2_LITE

    many = V2_LITE.with_tokens(1, 4096)
    assert writers.tensor_core_tile(TOY, torch.bfloat16, H100) == (16, 64, 1, 4)  # too few blocks for more
    assert writers.tensor_core_tile(many, torch.bfloat16, H100) == (64, 256, 2, 8)
    assert writers.tensor_core_tile(many, torch.float32, H100) == (64, 256, 2, 8)
    # in fp32 the 64-token tile needs 213 KiB at rank 512, more than an A100 has (the kernel's comment)
    assert writers.tensor_core_tile(many, torch.float32, A100) == (32, 128, 1, 4)


def test_step_5s_tiles_and_paddings_are_the_kernels_own():
    source = (steps.REPO / "solutions" / "05_tensor_cores.cu").read_text()
    tiles = tuple(tuple(int(n) for n in found) for found in re.findall(r"Config<T, (\d+), (\d+), (\d+), (\d+)>", source))
    assert tiles == writers.TENSOR_CORE_TILES
    assert re.findall(r"kPadA = (\d+)", source) == ["8", "4"] and re.findall(r"kPadB = (\d+)", source) == ["8", "8"]
    assert "row = warp_row + tm * 16 + lane / 4, column = warp_column + tn * 8 + lane % 4 * 2" in source


def test_step_5s_lanes_follow_the_mma_accumulator_layout():
    token, column = _token_and_column(TOY)
    # TOY runs 16-token, 64-column tiles with 4 warps across: warp 2 holds columns 32-47 of a tile,
    # and lanes 12-15 rows 3 and 11 of every 16 x 8 mma tile
    mask = (column % 64 // 16 == 2) & (token % 8 == 3)
    assert writers.written_by(5, mask, TOY, torch.bfloat16, H100) == "computed by warp 2 of every block, lanes 12-15"


@pytest.mark.gpu
def test_the_grader_names_the_warp_and_lanes_of_a_planted_step_5_mistake(tmp_path):
    """ex05 with one mistake in the fragments of warp 2, lanes 12-15: the failure line must say so."""
    source = (steps.REPO / "solutions" / "05_tensor_cores.cu").read_text()
    store = "      store_pair(out_tile + row * C::kStrideB + column, x, y);\n"
    assert source.count(store) == 1
    planted = source.replace(store, store.replace(", x, y)", ", x + (threadIdx.x / 32 == 2 && threadIdx.x % 32 / 4 == 3), y)"))
    path = tmp_path / "05_tensor_cores.cu"
    path.write_text(planted)
    result = grade_file(path, "ex05", quiet=True)
    assert result.status == "wrong" and "warp 2 of" in result.line and "lanes 12-15" in result.line, result.line
