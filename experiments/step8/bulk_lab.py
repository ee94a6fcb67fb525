"""Step 8 (kernels/08_bulk_mma.cu: TMA bulk copies and mma.sync at the toy, sm_90) and its variants,
timed beside step 7 on an H200: what kernels/NOTES.md ("Step 8 experiment 2", then step 8)
measured.

Each variant is 08_bulk_mma.cu with edits (failing loudly when the file no longer has the text an
edit replaces). Those in CORRECT are checked first against float64 with NaN-poisoned outputs, on
the shapes the launcher takes (FITTING); all are then timed in one process on the same inputs,
graph replay, median µs, in interleaved rounds (`bench.compare`):

    python experiments/step8/bulk_lab.py [VARIANT...]          # all of them by default
    python experiments/step8/bulk_lab.py --check [VARIANT...]  # the quick shapes only (for compute-sanitizer)
    python experiments/step8/bulk_lab.py --profile VARIANT DTYPE  # 4 toy calls, no checks (for ncu --launch-skip 3)

  base        kernels/08_bulk_mma.cu (the launcher picks the splits)
  step7       kernels/07_latency.cu, the course's kernel for the toy
  splits2     2 blocks per token tile (k and v)
  splits8     the most blocks per token tile, up to 8, in one wave or not
  down_whole  w_down in one bulk copy instead of 4 KB ones spread over the issuing threads
  down_1k     w_down in 1 KB copies
  threads512  16 warps instead of 8
  issuers32, issuers64, issuers512   the copies issued by 1, 2 or 16 warps instead of 4
  unpadded    hidden and up rows unpadded in shared memory (hidden in one copy; bank conflicts)
  unpadded_splits2   the same with 2 splits, so that each up slice is one copy too
  fewest      unpadded_splits2 and down_whole: three copies per block
  up_unpadded_splits2   only the up slice unpadded, 2 splits: one copy for it
  empty       returns at once: what the launch of this grid costs
  one_copy    each operand in one bulk copy, rows unpadded (garbage: for timing only)
  timeline    no output stores; thread 0 of every block marks clock64 after each phase, written
              over the output (printed as medians (max) over the blocks, then timed)

experiments/step8/tma_copies.patch is the form with TMA tensor copies (stop 29; not adopted,
kernels/NOTES.md; since stop 31 each lane's swizzled offsets are worked out once, not yet run on a
GPU, and the form stop 29 measured is the patch as commit ec1efe3 has it): `git apply` it and this
lab's base is that form and its variant `bulk` the bulk copies (`python
experiments/step8/bulk_lab.py base bulk step7`); `git apply -R` takes it back out.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/labkit.py
import labkit  # noqa: E402
from mla_lab import check, steps  # noqa: E402
from mla_lab.problem import TOY, Shape  # noqa: E402

BUILD = Path(__file__).resolve().parent / "build" / "bulk"
KERNEL = "kernels/08_bulk_mma.cu"
PHASES = ("barriers set up", "copies issued", "zeroed", "operands landed", "GEMM 1, thread 0's warp's part",
          "its part stored", "every part added", "up landed", "GEMM 2")
MARKS = 12  # kMarks in 08_bulk_mma.cu

# Each operand in one bulk copy, its rows unpadded (so the results are garbage): does the number
# of copies set how long they take?
ONE_COPY = (
    ("  const int copies = hidden_copies + down_copies + (up_whole ? 1 : g.rank);\n",
     "  if (threadIdx.x == 0) {\n"
     "    bulk_copy(s_hidden, hidden + token0 * g.d_model, rows * row_bytes, operands_landed);\n"
     "    bulk_copy(s_down, w_down, down_bytes, operands_landed);\n"
     "    bulk_copy(s_up, up_from, uint32_t(g.rank) * up_row_bytes, up_landed);\n"
     "  }\n"
     "  const int copies = 0;\n"),
)
PADS = "constexpr int kHiddenPad = 16, kUpPad = 16;"
SPLITS2 = ("constexpr int kMaxSplits = 8;", "constexpr int kMaxSplits = 2;")
DOWN_WHOLE = ("constexpr int kDownChunkBytes = 4096;", "constexpr int kDownChunkBytes = 1 << 20;")
EDITS = {
    "splits2": (SPLITS2,),
    "splits8": (("constexpr bool kMostSplits = false;", "constexpr bool kMostSplits = true;"),),
    "down_whole": (DOWN_WHOLE,),
    "down_1k": (("constexpr int kDownChunkBytes = 4096;", "constexpr int kDownChunkBytes = 1024;"),),
    "threads512": (("constexpr int kThreads = 256;", "constexpr int kThreads = 512;"),),
    **{f"issuers{n}": (("constexpr int kIssuers = 128;", f"constexpr int kIssuers = {n};"),) for n in (32, 64, 512)},
    "unpadded": ((PADS, "constexpr int kHiddenPad = 0, kUpPad = 0;"),),
    "unpadded_splits2": ((PADS, "constexpr int kHiddenPad = 0, kUpPad = 0;"), SPLITS2),
    "fewest": ((PADS, "constexpr int kHiddenPad = 0, kUpPad = 0;"), SPLITS2, DOWN_WHOLE),
    "up_unpadded_splits2": ((PADS, "constexpr int kHiddenPad = 16, kUpPad = 0;"), SPLITS2),
    "empty": (("  extern __shared__ __align__(128) uint8_t shared[];\n",
               "  extern __shared__ __align__(128) uint8_t shared[];\n  if (g.tokens > 0) return;\n"),),
    "timeline": (("constexpr bool kTimeline = false;", "constexpr bool kTimeline = true;"),),
    "one_copy": ONE_COPY,
}
CORRECT = ("base", "step7", "splits2", "splits8", "down_whole", "down_1k", "threads512", "issuers32", "issuers64", "issuers512",
           "unpadded", "unpadded_splits2", "fewest", "up_unpadded_splits2")
VARIANTS = ("base", "step7", *EDITS)
TIMED = (("toy fp32", TOY, torch.float32), ("toy bf16", TOY, torch.bfloat16),
         ("toy@4096 bf16", Shape(1, 4096, 256, 48, 4, 32), torch.bfloat16),
         ("toy@4096 fp32", Shape(1, 4096, 256, 48, 4, 32), torch.float32))

def fits(shape: Shape, element_bytes: int) -> bool:
    """Whether step 8's own launcher takes the shape (mla_lab/steps.py mirrors its tests)."""
    return steps.bulk_mma_takes(shape.d_model, shape.rank, shape.width, element_bytes)


EXTRA = (Shape(3, 37, 256, 48, 4, 32),   # a last tile of 15 tokens
         Shape(1, 17, 64, 16, 1, 8),     # one 8-column tile per block
         Shape(2, 9, 128, 64, 3, 24),    # 72-column slices
         Shape(1, 5, 32, 32, 2, 16))
FITTING = tuple(dict.fromkeys(s for s in (TOY, *check.SHAPE_MATRIX, *EXTRA) if fits(s, 4)))
QUICK = tuple(s for s in FITTING if s.tokens <= 200)

# The checks and timings run each variant with step 7's limits (rank <= 512) and no fallback step.
AS_STEP = 7


def lab_source(name: str) -> Path:
    return labkit.edited_source(KERNEL, name, EDITS, "HEAD", BUILD)  # no "previous" variant


def timeline(kernel, shape, dtype) -> str:
    """The timeline variant's marks from one call: median (max) over the blocks."""
    marks = labkit.marks_of(kernel, shape, dtype, MARKS)
    marks = marks[marks[:, -1] == 1, : len(PHASES)]  # the blocks the grid had (their last word is 1)
    return f"{marks.shape[0]} blocks: " + "  ".join(
        f"{name} {column.median():,.0f} ({column.max():,.0f})" for name, column in zip(PHASES, marks.T))


def main(names: list[str]) -> int:
    if names[:1] == ["--profile"] and len(names) == 3:
        labkit.call_for_a_profiler(AS_STEP, lab_source(names[1]), f"lab08b_{names[1]}", TOY, getattr(torch, names[2]))
        return 0
    if names[:1] == ["--check"]:
        names = names[1:] or ["base"]
        labkit.build_and_check(AS_STEP, {name: lab_source(name) for name in names}, CORRECT, QUICK, "lab08b")
        return 0

    def print_timeline(kernels, shape, dtype):
        if "timeline" in kernels:
            print("  timeline, cycles:", timeline(kernels["timeline"], shape, dtype), flush=True)

    return labkit.run(AS_STEP, {name: lab_source(name) for name in names or VARIANTS}, CORRECT, TIMED,
                      with_peers=True, digits=2, after_row=print_timeline, shapes=FITTING, lab="lab08b")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
