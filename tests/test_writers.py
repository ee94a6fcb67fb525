"""The thread part of the failure line, on planted masks (mla_lab.writers)."""

import re

import pytest
import torch

from mla_lab import TOY, steps, writers
from mla_lab.grade import grade_file
from mla_lab.problem import Shape


def _plant_and_grade(tmp_path, solution: str, exercise: str, line: str, planted: str):
    source = (steps.REPO / "solutions" / solution).read_text()
    assert source.count(line) == 1
    path = tmp_path / solution
    path.write_text(source.replace(line, planted))
    return grade_file(path, exercise, quiet=True)


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
    assert writers.written_by(9, torch.ones(TOY.out_shape, dtype=torch.bool), TOY) is None
    assert writers.written_by(6, torch.ones(TOY.out_shape, dtype=torch.bool), TOY) is None  # fp32 runs step 5
    assert writers.written_by(5, torch.ones(TOY.out_shape, dtype=torch.bool), TOY) is None  # its tile needs the GPU


def test_step_3s_warps_hold_rows_and_its_lanes_columns():
    block, thread = writers.thread_ids(3, TOY)
    # one row of every token tile, in every column: the rows of warp 2 (tokens 8-11 of each tile)
    token, _ = writers.token_and_column(TOY)
    mask = (token % 32 >= 8) & (token % 32 < 12)
    assert writers.written_by(3, mask, TOY) == "written by warp 2 of every block, all 32 lanes"
    assert int(block.max()) == TOY.tokens // 32 - 1


def test_step_4s_warps_hold_columns_and_its_lanes_token_groups():
    token, column = writers.token_and_column(TOY)
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
    store = "        if (token >= p.tokens) break;\n"
    result = _plant_and_grade(tmp_path, "04_vectorized.cu", "ex04", store,
                              store + "        if (threadIdx.x / 32 == 3 && threadIdx.x % 32 / 8 == 1) acc[i][j][0] += 1.0f;\n")
    assert result.status == "wrong" and "warp 3 of" in result.line and "lanes 8-15" in result.line, result.line


H100 = writers.H100
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
    token, column = writers.token_and_column(TOY)
    # TOY runs 16-token, 64-column tiles with 4 warps across: warp 2 holds columns 32-47 of a tile,
    # and lanes 12-15 rows 3 and 11 of every 16 x 8 mma tile
    mask = (column % 64 // 16 == 2) & (token % 8 == 3)
    assert writers.written_by(5, mask, TOY, torch.bfloat16, H100) == "computed by warp 2 of every block, lanes 12-15"


@pytest.mark.gpu
def test_the_grader_names_the_warp_and_lanes_of_a_planted_step_5_mistake(tmp_path):
    """ex05 with one mistake in the fragments of warp 2, lanes 12-15: the failure line must say so."""
    store = "      store_pair(out_tile + row * C::kStrideB + column, x, y);\n"
    result = _plant_and_grade(tmp_path, "05_tensor_cores.cu", "ex05", store,
                              store.replace(", x, y)", ", x + (threadIdx.x / 32 == 2 && threadIdx.x % 32 / 4 == 3), y)"))
    assert result.status == "wrong" and "warp 2 of" in result.line and "lanes 12-15" in result.line, result.line


def test_step_8s_splits_and_lanes():
    assert writers.bulk_mma_splits(TOY, H100) == 4  # 24 token tiles x 6 blocks would not fit one wave of 132 SMs
    assert writers.bulk_mma_splits(TOY.with_tokens(1, 16), H100) == 8
    assert writers.bulk_mma_splits(TOY.with_tokens(1, 1024), H100) == 2
    token, column = writers.token_and_column(TOY)
    # TOY's 256 [k | v] columns in 4 slices of 64: warp 2 stores columns 16-23 of each slice, lanes 4-7 rows 1 and 9
    mask = (column % 64 // 8 == 2) & (token % 8 == 1)
    assert writers.written_by(8, mask, TOY, torch.bfloat16, H100) == "written by warp 2 of every block, lanes 4-7"


def test_step_8s_plan_is_the_kernels_own():
    source = (steps.REPO / "solutions" / "08_bulk_mma.cu").read_text()
    assert "for (int s = 4; s <= kMaxSplits; s += 2)" in source and "constexpr int kMaxSplits = 8;" in source
    assert "(2 * p.heads * p.head_dim) % (8 * s) == 0 && tiles * s <= mla::multiprocessor_count()" in source
    assert "for (int n0 = warp * 8; n0 < g.slice; n0 += kWarps * 8)" in source and "constexpr int kTokens = 16;" in source


def test_step_11s_rows_per_tile_and_its_storing_threads():
    from mla_lab.problem import V2_LITE

    assert writers.decode_rows(V2_LITE.with_tokens(1, 16), torch.bfloat16) == 16
    assert writers.decode_rows(V2_LITE.with_tokens(1, 64), torch.bfloat16) == 64
    shape = V2_LITE.with_tokens(1, 20)
    token, column = writers.token_and_column(shape)
    # 16-token tiles: row 5 of each tile is elements 40-47 of the threads' walk, warp 1's lanes 8-15
    mask = token % 16 == 5
    assert writers.written_by(11, mask, shape, torch.bfloat16) == "written by warp 1 of every block, lanes 8-15"


def test_step_11s_plan_is_the_kernels_own():
    source = (steps.REPO / "solutions" / "11_decode.cu").read_text()
    for fact in ("constexpr int kThreads = 256;", "constexpr int kColumns = 32;", "constexpr int kSharedBudget = 227 * 1024;",
                 "kWeightPitch = kColumns + 8;", "constexpr int kPartialPitch = kColumns + 8;",
                 "return depth + 16 / int(sizeof(T));", "if (row_tiles == 4 && tokens < 64) continue;",
                 "const int m = e / (kColumns / 4) * splits + rank, group = e % (kColumns / 4);",
                 "launch_pass(up, 1, stream)"):
        assert fact in source, fact


@pytest.mark.gpu
def test_the_grader_names_the_warp_and_lanes_of_a_planted_step_8_mistake(tmp_path):
    line = "    if (gid < rows) store_pair(row, c[0], c[1]);\n"
    result = _plant_and_grade(tmp_path, "08_bulk_mma.cu", "ex08", line,
                              "    c[0] += float(warp == 2 && gid == 1);\n" + line)
    assert result.status == "wrong" and "warp 2 of" in result.line and "lanes 4-7" in result.line, result.line


@pytest.mark.gpu
def test_the_grader_names_the_warp_and_lanes_of_a_planted_step_11_mistake(tmp_path):
    """GEMM 2's pass only (GEMM 1's writes the latent, which every output element reads)."""
    line = "      store_four(p.out + int64_t(token) * p.out_pitch + column, sum);\n"
    planted = "      if (p.after_primary && threadIdx.x / 32 == 1 && threadIdx.x % 32 / 8 == 1) sum.x += 1.0f;\n" + line
    result = _plant_and_grade(tmp_path, "11_decode.cu", "ex11", line, planted)
    assert result.status == "wrong" and "warp 1 of" in result.line and "lanes 8-15" in result.line, result.line


def test_step_7s_pass_width_and_its_storing_threads():
    from mla_lab.problem import V2_LITE

    # two splits of 4 column tiles still fit 48 token tiles in one wave of 132 SMs; three would take two
    assert writers.cheapest_column_split(132, 48, 4, 100.0, 10.0, 64) == (2, 120.0)
    assert writers.latency_pass_width(TOY, H100) == 128
    assert writers.latency_pass_width(V2_LITE.with_tokens(1, 8), H100) == 32  # one token tile: 128 blocks of 32 columns
    token, column = writers.token_and_column(TOY)
    # TOY's passes are 128 columns wide: thread t takes token t // 128 and column t % 128 of the pass, and
    # every 512th result after, so warp 3 holds columns 96-127 of tokens 0 and 4 of every 8-token tile
    mask = (token % 4 == 0) & (column % 128 >= 96)
    assert writers.written_by(7, mask, TOY, torch.float32, H100) == "written by warp 3 of every block, all 32 lanes"


def test_step_7s_plan_is_the_kernels_own():
    source = (steps.REPO / "solutions" / "07_latency.cu").read_text()
    for fact in ("constexpr int kThreads = 512;", "constexpr int kTokens = 8;", "constexpr int kMaxPassShift = 8;",
                 "for (int pass = 1 << kMaxPassShift; pass >= 32; pass /= 2)",
                 "slots, token_tiles, mla::ceil_div(2 * g.width, pass), double(g.d_model) * double(g.rank),\n"
                 "        double(g.rank) * pass, 1024);",
                 "for (int e = threadIdx.x; e < kTokens << s.pass_shift; e += kThreads)",
                 "const int m = e >> s.pass_shift, c = e & (pass_width - 1);"):
        assert fact in source, fact
    common = (steps.REPO / "kernels" / "mla_common.cuh").read_text()
    assert "const double cost = waves * (latent_work + column_tile_work * double(ceil_div(column_tiles, splits)));" in common


@pytest.mark.gpu
def test_the_grader_names_the_warp_and_lanes_of_a_planted_step_7_mistake(tmp_path):
    line = "        out[(token0 + m) * (2 * g.width) + s.column0 + c] = mla::from_float<T>(sum);\n"
    planted = line.replace("(sum)", "(sum + float(threadIdx.x / 32 == 3 && threadIdx.x % 32 < 4))")
    result = _plant_and_grade(tmp_path, "07_latency.cu", "ex07", line, planted)
    assert result.status == "wrong" and "warp 3 of" in result.line and "lanes 0-3" in result.line, result.line


def test_step_6s_warps_hold_rows_of_a_consumer_warpgroup_and_its_lanes_the_wgmma_fragment():
    shape = TOY.with_tokens(1, 300)
    token, column = writers.token_and_column(shape)
    # row 19 of every 128-token tile is row 3 of warp 1's 16; columns 0, 2, 4 and 6 of an output tile
    # start the fragments of lanes 12-15
    mask = (token % 128 == 19) & (column % 128 < 8) & (column % 2 == 0)
    assert writers.written_by(6, mask, shape, torch.bfloat16) == \
        "computed by warp 1 of a consumer warpgroup in every block, lanes 12-15"
    assert writers.written_by(6, mask & (token < 128), shape, torch.bfloat16) == \
        "computed by warp 1 of a consumer warpgroup in the blocks of 128-token tile 0, lanes 12-15"
    narrow = Shape(1, 300, 256, 48, 3, 32)  # 96 columns a head: the binding runs step 5
    assert writers.written_by(6, torch.ones(narrow.out_shape, dtype=torch.bool), narrow, torch.bfloat16) is None


def test_step_6s_geometry_is_the_kernels_own():
    source = (steps.REPO / "solutions" / "06_hopper.cu").read_text()
    for fact in ("constexpr int kTokens = 128;", "constexpr int kColumns = 128;", "constexpr int kMaxRank = 512;",
                 "const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;",
                 "const int row = warp * 16 + lane / 4, column = 8 * i + lane % 4 * 2;",
                 "if (index % 2 != consumer) continue;",
                 "p->d_model % 8 == 0 && p->rank % 8 == 0 && p->rank <= kMaxRank &&\n"
                 "         p->heads * p->head_dim % 64 == 0"):
        assert fact in source, fact


@pytest.mark.gpu
def test_the_grader_names_the_warp_and_lanes_of_a_planted_step_6_mistake(tmp_path):
    """One fragment of GEMM 2's upper rows wrong: warp 1 of the warpgroup, lanes 12-15, row 19 of a tile."""
    line = "    store_tile(upper, out, token0, s.tokens, columns, column0);\n"
    planted = "    if (threadIdx.x / 32 % 4 == 1 && threadIdx.x % 32 / 4 == 3) upper[0] += 1.0f;\n" + line
    result = _plant_and_grade(tmp_path, "06_hopper.cu", "ex06", line, planted)
    assert result.status == "wrong" and "warp 1 of a consumer warpgroup" in result.line and "lanes 12-15" in result.line, \
        result.line
