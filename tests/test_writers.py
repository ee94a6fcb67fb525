"""The thread part of the failure line, on planted masks (mla_lab.writers)."""

import torch

from mla_lab import TOY, writers


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


def test_step_3s_warps_hold_rows_and_its_lanes_columns():
    block, thread = writers.thread_ids(3, TOY)
    # one row of every token tile, in every column: the rows of warp 2 (tokens 8-11 of each tile)
    token = torch.arange(TOY.tokens).reshape(TOY.batch, TOY.seq, 1, 1, 1).expand(TOY.out_shape)
    mask = (token % 32 >= 8) & (token % 32 < 12)
    assert writers.written_by(3, mask, TOY) == "written by warp 2 of every block, all 32 lanes"
    assert int(block.max()) == TOY.tokens // 32 - 1
