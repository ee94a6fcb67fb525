"""The step 8 experiment (experiments/step8/cluster.cu: a cluster of 8 blocks splitting each token
tile's reduction, sm_90) timed beside step 7 on an H200: what kernels/NOTES.md ("Step 8
experiment") measured, and why it is not a course step.

Each variant is cluster.cu with edits (failing loudly when the file no longer has the text an edit
replaces). Those in CORRECT compute the projection and are checked first, on the shapes whose
block share fits the kernel's shared-memory budget; the others compute garbage and are for timing
only. All are timed in one process on the same inputs, graph replay, median µs, in interleaved
rounds (`bench.compare`):

    python experiments/step8/lab.py [VARIANT...]     # all of them by default
    python experiments/step8/lab.py --check [VARIANT...]   # build and check on the quick shapes (for compute-sanitizer)
    python experiments/step8/lab.py --profile VARIANT      # 4 toy fp32 calls, no checks (for ncu --launch-skip 3)

  base        experiments/step8/cluster.cu
  step7       kernels/07_latency.cu, the course's kernel for the toy
  cluster4    clusters of 4 blocks, each with a quarter of d_model and of the output columns
  tokens16    16 tokens per tile instead of 32 (twice the clusters, half the rows per warp)
  threads512, threads1024   more warps per block, each with fewer of the tile's tokens
  one_column  one column per lane in both GEMMs, also where two would fit
  stage_advancing   a thread finds its first copy by a division and advances from it (not one per copy)
  empty       returns at once: what the launch of this grid of clusters costs
  timeline    no output stores, plus a clock64 mark by thread 0 of every block after each phase,
              written over the output (printed as medians (max) over the blocks, then timed)
  warm        timeline, after staging the copies and running GEMM 1 once already: how long
              each takes the second time (marked too)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/labkit.py
import labkit  # noqa: E402
from mla_lab import check, steps  # noqa: E402
from mla_lab.problem import TOY, Shape  # noqa: E402

BUILD = Path(__file__).resolve().parent / "build"
KERNEL = "experiments/step8/cluster.cu"
START = "  extern __shared__ __align__(16) uint8_t shared[];\n"
PHASES = ("started", "copies issued", "landed", "barrier 0", "GEMM 1", "barrier 1", "added and sent", "barrier 2",
          "GEMM 2", "warm: landed again", "warm: GEMM 1 again")
GEMM1_END = "                });\n"  # with the text after it, where GEMM 1's store ends


def mark(index: int) -> str:
    return f"  if (threadIdx.x == 0) lab_marks[{index}] = clock64() - lab_start;\n"


def mark_after(text: str, index: int, context: str = "") -> tuple[str, str]:
    """An edit that marks phase `index` after `text` (found, with `context` after it, exactly once)."""
    return text + context, text + mark(index) + context


TIMELINE = (
    (START, START + "  __shared__ long long lab_marks[16];\n  const long long lab_start = clock64();\n"
            "  for (int i = threadIdx.x; i < 16; i += kThreads) lab_marks[i] = -1;\n"),
    ("  if (token0 + token < g.tokens) {", "  if (token0 + token < g.tokens && g.tokens < 0) {"),
    mark_after("  const int share_tile = kTokens * g.share;  // floats of one share of a latent tile\n", 0),
    mark_after("  mla::commit_copies();\n", 1),
    mark_after("  mla::wait_for_copies(0);\n  __syncthreads();\n", 2),
    mark_after("  cluster.barrier_wait();\n", 3, "\n  // GEMM 1 over"),
    mark_after(GEMM1_END, 4, "  cluster.barrier_arrive();\n  cluster.barrier_wait();\n\n  // Add up"),
    mark_after("  cluster.barrier_wait();\n", 5, "\n  // Add up"),
    mark_after("  cluster.barrier_arrive();\n", 6, "  cluster.barrier_wait();\n\n  // GEMM 2"),
    mark_after("  cluster.barrier_wait();\n", 7, "\n  // GEMM 2"),
    (GEMM1_END + "}\n",
     GEMM1_END + "  __syncthreads();\n" + mark(8) +
     "  if (threadIdx.x == 0) {\n"
     "    long long* row = reinterpret_cast<long long*>(out) + blockIdx.x * 16;\n"
     "    for (int i = 0; i < 16; ++i) row[i] = lab_marks[i];\n  }\n}\n"),
)


def warm_edit() -> tuple[str, str]:
    """Stages the copies and runs GEMM 1 once before the timed flow (its stores behind a condition
    false at run time, so that the arithmetic stays), marking how long each takes when the code
    and data have just been used (is the first pass slow for being the first?)."""
    text = (steps.REPO / KERNEL).read_text()
    staging = text[text.index("  stage(tile.hidden,"):text.index("  mla::commit_copies();\n")]
    gemm1_start = text.index("  float* const inbox =")
    gemm1 = text[gemm1_start:text.index(GEMM1_END, gemm1_start) + len(GEMM1_END)]
    gemm1 = gemm1.replace("store_remote(", "if (g.tokens < 0) store_remote(")
    land = "  mla::commit_copies();\n  mla::wait_for_copies(0);\n  __syncthreads();\n"
    rehearsal = ("  {\n" + staging + land + gemm1 + "  }\n  __syncthreads();\n  const long long lab_warm = clock64();\n"
                 "  {\n" + staging + land + "  if (threadIdx.x == 0) lab_marks[9] = clock64() - lab_warm;\n" + gemm1 +
                 "  if (threadIdx.x == 0) lab_marks[10] = clock64() - lab_warm;\n  }\n  __syncthreads();\n")
    return staging, rehearsal + staging


# A thread's place in a tile found by one division, then advanced run by run, against a division
# per run (the timeline of the toy: about 3,300 cycles after a block's setup to issue 16 KB of copies).
STAGE_ADVANCING = (
    "  for (int run = threadIdx.x; run < rows * runs_per_row; run += kThreads) {\n"
    "    const int r = run / runs_per_row, q = (run - r * runs_per_row) * kRun;\n",
    "  const int row_step = kThreads / runs_per_row, run_step = (kThreads - row_step * runs_per_row) * kRun;\n"
    "  int r = threadIdx.x / runs_per_row, q = (threadIdx.x - r * runs_per_row) * kRun;\n"
    "  for (; r < rows; r += row_step, q += run_step) {\n"
    "    if (q >= stride) q -= stride, ++r;\n"
    "    if (r >= rows) break;\n")
EDITS = {
    "cluster4": (("constexpr int kCluster = 8;", "constexpr int kCluster = 4;"),),
    "tokens16": (("constexpr int kTokens = 32;", "constexpr int kTokens = 16;"),),
    "threads512": (("constexpr int kThreads = 256;", "constexpr int kThreads = 512;"),),
    "threads1024": (("constexpr int kThreads = 256;", "constexpr int kThreads = 1024;"),),
    "one_column": (("  if (width % 64 == 0) {", "  if (width < 0) {"),),
    "empty": ((START, START + "  if (g.tokens > 0) return;\n"),),
    "stage_advancing": (STAGE_ADVANCING,),
    "timeline": TIMELINE,
    "warm": (*TIMELINE, warm_edit()),
}
CORRECT = ("base", "step7", "cluster4", "tokens16", "threads512", "threads1024", "one_column", "stage_advancing")
VARIANTS = ("base", "step7", *EDITS)
TIMED = (("toy fp32", TOY, torch.float32), ("toy bf16", TOY, torch.bfloat16),
         ("toy@4096 bf16", Shape(1, 4096, 256, 48, 4, 32), torch.bfloat16))


SHARED_BUDGET = 160 * 1024  # kSharedBudget in cluster.cu


def fits(shape: Shape, element_bytes: int, cluster: int = 8) -> bool:
    """Whether cluster.cu (or a variant with `cluster` blocks per cluster) takes the shape (mirrors
    its shared_bytes()): a block's share of d_model (32 tokens of hidden, those rows of w_down) and
    of the output columns, and two fp32 latent tiles, rows padded to 8 elements and weight rows
    to chunks of 32."""
    def round_up(a: int, b: int) -> int:
        return -(-a // b) * b

    depth_share = round_up(-(-shape.d_model // cluster), 8)
    share = round_up(-(-shape.rank // cluster), 4)
    columns_padded = round_up(round_up(-(-2 * shape.width // cluster), 8), 32)
    weights = 32 * depth_share + depth_share * round_up(shape.rank, 32) + -(-shape.rank // share) * share * columns_padded
    return element_bytes * weights + 4 * 2 * cluster * 32 * share <= SHARED_BUDGET


# Shapes every variant takes (cluster4's shares are the largest), and the small ones among them
# for compute-sanitizer.
CHECKED = tuple(dict.fromkeys(s for s in (TOY, *check.QUICK_SHAPES, *check.SHAPE_MATRIX) if fits(s, 4, cluster=4)))
QUICK = tuple(s for s in CHECKED if s in check.QUICK_SHAPES)


# The checks and timings run it with step 7's limits (rank <= 512) and no fallback step.
AS_STEP = 7


def lab_source(name: str) -> Path:
    return labkit.edited_source(KERNEL, name, EDITS, "HEAD", BUILD)  # no "previous" variant


def timeline(kernel, shape, dtype) -> str:
    """A timeline variant's marks from one call: thread 0's clock64 cycles at the end of each phase,
    median and max over the blocks."""
    blocks = -(-shape.tokens // 32) * 8  # token tiles of 32 (kTokens), 8 blocks each (kCluster)
    marks = labkit.marks_of(kernel, shape, dtype, 16)[:blocks]
    shown = []
    for name, column in zip(PHASES, marks.T):
        if bool((column >= 0).all()):
            shown.append(f"{name} {column.median():,.0f} ({column.max():,.0f})")
    return "  ".join(shown)


def main(names: list[str]) -> int:
    if names[:1] == ["--profile"] and len(names) == 2:
        labkit.call_for_a_profiler(AS_STEP, lab_source(names[1]), f"lab08_{names[1]}", TOY, torch.float32)
        return 0
    if names[:1] == ["--check"]:
        names = names[1:] or ["base"]
        labkit.build_and_check(AS_STEP, {name: lab_source(name) for name in names}, CORRECT, QUICK, "lab08")
        return 0

    def print_timeline(kernels, shape, dtype):
        for name in ("timeline", "warm"):
            if name in kernels:
                print(f"  {name}, cycles:", timeline(kernels[name], shape, dtype), flush=True)

    return labkit.run(AS_STEP, {name: lab_source(name) for name in names or VARIANTS}, CORRECT, TIMED,
                      with_peers=True, digits=2, after_row=print_timeline, shapes=CHECKED, lab="lab08")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
