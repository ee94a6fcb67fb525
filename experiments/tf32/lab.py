"""Steps 9 and 10 (kernels/09_tf32_wgmma.cu: fp32 inputs as two TF32 wgmma GEMMs, the weights
first transposed into the workspace, sm_90a; kernels/10_three_passes.cu: the same in three TF32
passes, fp32's accuracy) and their variants, timed beside step 5 (the course's TF32 step on
mma.sync), eager, cuBLAS and cuBLAS with TF32 allowed on an H200: what kernels/NOTES.md ("Step 9
experiment: TF32 on Hopper" and "Three TF32 passes") reports. Until stop 29 these were an
experiment here, as two_gemms.cu. Made steps, the base took the TMA maps typed TFLOAT32 (the
notes' `tfloat32_maps`; `float32_maps` is the notes' base), and three passes the 128 x 128 GEMM 2
tiles (the notes' `three_passes_gemm2_narrow`; `three_passes_gemm2_wide` is the notes'
`three_passes`).

Each variant is 09_tf32_wgmma.cu with edits (failing loudly when the file no longer has the text an
edit replaces). Those in CORRECT are checked first against float64 with NaN-poisoned outputs, on
the shapes the launcher takes (FITTING); every variant is then timed in one process on the same
inputs, graph replay, median µs, in interleaved rounds (`bench.compare`); a variant that fails a
check is reported and left out of the timings (`labkit.run`). fp32 only: the steps are for fp32
inputs (bf16 runs their fallbacks).

    python experiments/tf32/lab.py [VARIANT...]          # all of them by default
    python experiments/tf32/lab.py --check [VARIANT...]  # the quick shapes only (for compute-sanitizer)
    python experiments/tf32/lab.py --profile VARIANT     # 4 calls at V2-Lite 4096 tokens, no checks
                                                          # (3 kernels a call, 4 with three passes:
                                                          # ncu --launch-skip 9 --launch-count 3, or 12 and 4)

  base          step 9: GEMM 1 in 128 x 128 tiles, GEMM 2 in 128 x 256, TMA maps typed TFLOAT32
  step5         step 5 (solutions/ex04_tensor_cores.cu), the course's TF32 step, built as the others are
  gemm1_wide    GEMM 1 in 128 x 256 tiles (half the blocks, fewer bytes per FLOP)
  gemm2_narrow  GEMM 2 in 128 x 128 tiles
  gemm2_rows64  GEMM 2 in 64 x 256 tiles, the two consumers splitting the columns: the block a
                fused TF32 kernel would have (its latent tile holds 64 tokens)
  gemm2_two_per_sm  GEMM 2 in 64 x 128 tiles, 4 stages: two blocks per SM, so that one stores its
                tile while the other computes
  float32_maps  every TMA map typed FLOAT32, as the experiment first had it: the tensor cores then
                drop hidden's low bits instead of TMA rounding them
  transposes    the transposes alone (garbage: for timing only)
  gemm1         GEMM 1 alone (garbage)
  gemm2         GEMM 2 alone (garbage)
  no_stores     both GEMMs with their stores predicated off at run time (garbage): what storing costs
  three_passes  step 10: every operand split into TF32 hi and lo parts, each product taken as three
                passes (hi*hi + hi*lo + lo*hi), hidden split by a kernel of its own, GEMM 2 in 128
                x 128 tiles, each GEMM's tensor-core sums added into registers every 4 chunks; held
                to fp32's tolerance, not TF32's
  three_passes_gemm2_wide  the same, GEMM 2 in 128 x 256 tiles (2 stages instead of 3, and its sums
                left to the tensor cores: no room in registers for a second set)
  three_passes_promote_16  the sums added into registers every 16 chunks, not 4
  three_passes_unpromoted  no such adds: the tensor cores carry every sum (timed, not checked: it
                misses fp32's tolerance from d_model 2048 up)
  three_passes_transposes, three_passes_gemm1, three_passes_gemm2  three passes, one phase alone
                (garbage); the transposes' phase includes the split of hidden
  row_by_row, three_passes_row_by_row  steps 9 and 10 with their blocks in the order they had
                before stop 30, row tile by row tile, instead of in groups of 16 row tiles
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/labkit.py
import labkit  # noqa: E402
from mla_lab import bench, check, steps  # noqa: E402
from mla_lab.problem import V2_LITE, V3, V3_TP8, Shape  # noqa: E402

BUILD = Path(__file__).resolve().parent / "build"
KERNEL = "kernels/09_tf32_wgmma.cu"
STEP = steps.get(9)
# Three passes keep fp32's accuracy: those variants are built, run and checked as step 10 (1e-5).
THREE_PASSES_STEP = steps.get(10)

PHASES = "constexpr bool kTransposes = true, kGemm1 = true, kGemm2 = true;"
THREE_PASSES_OFF, THREE_PASSES_ON = "#define MLA_THREE_PASSES 0", "#define MLA_THREE_PASSES 1"
GEMM2_TILE = "using Gemm2Tile = Tile<128, kThreePasses ? 128 : 256>;"
EDITS: labkit.Edits = {
    "base": (),
    "gemm1_wide": (("using Gemm1Tile = Tile<128, 128>;", "using Gemm1Tile = Tile<128, 256>;"),),
    "gemm2_narrow": ((GEMM2_TILE, "using Gemm2Tile = Tile<128, 128>;"),),
    "gemm2_rows64": ((GEMM2_TILE, "using Gemm2Tile = Tile<64, 256>;"),),
    "gemm2_two_per_sm": ((GEMM2_TILE, "using Gemm2Tile = Tile<64, 128, 4>;"),),
    "float32_maps": (("CU_TENSOR_MAP_DATA_TYPE_TFLOAT32", "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"),),
    # k is never negative: no result is stored, but ptxas cannot know that, so it keeps every wgmma
    "no_stores": (("      if (row + 8 * half < m && column < n) {", "      if (row + 8 * half < m && column < n && k < 0) {"),),
    "transposes": ((PHASES, "constexpr bool kTransposes = true, kGemm1 = false, kGemm2 = false;"),),
    "gemm1": ((PHASES, "constexpr bool kTransposes = false, kGemm1 = true, kGemm2 = false;"),),
    "gemm2": ((PHASES, "constexpr bool kTransposes = false, kGemm1 = false, kGemm2 = true;"),),
    "three_passes": ((THREE_PASSES_OFF, THREE_PASSES_ON),),
    "three_passes_gemm2_wide": ((THREE_PASSES_OFF, THREE_PASSES_ON), (GEMM2_TILE, "using Gemm2Tile = Tile<128, 256>;")),
}
PROMOTE_EVERY = "constexpr int kPromoteEvery = 4;"
# Blocks row tile by row tile, as before stop 30 (a group of one row tile is that order).
ROW_BY_ROW = ("constexpr int64_t kGroupRows = 16;", "constexpr int64_t kGroupRows = 1;")
EDITS["row_by_row"] = (ROW_BY_ROW,)
EDITS["three_passes_row_by_row"] = ((THREE_PASSES_OFF, THREE_PASSES_ON), ROW_BY_ROW)
EDITS["three_passes_promote_16"] = ((THREE_PASSES_OFF, THREE_PASSES_ON), (PROMOTE_EVERY, "constexpr int kPromoteEvery = 16;"))
EDITS["three_passes_unpromoted"] = ((THREE_PASSES_OFF, THREE_PASSES_ON), (PROMOTE_EVERY, "constexpr int kPromoteEvery = 0;"))
PHASE_VARIANTS = ("transposes", "gemm1", "gemm2")
EDITS.update({f"three_passes_{phase}": ((THREE_PASSES_OFF, THREE_PASSES_ON), *EDITS[phase]) for phase in PHASE_VARIANTS})
VARIANTS = ("base", "step5", *[name for name in EDITS if name != "base"])
GARBAGE = (*PHASE_VARIANTS, *[f"three_passes_{phase}" for phase in PHASE_VARIANTS], "no_stores")
# Timed but not checked: measured beyond fp32's tolerance at d_model 2048 and up (NOTES).
INACCURATE = ("three_passes_unpromoted",)
CORRECT = tuple(name for name in VARIANTS if name not in GARBAGE + INACCURATE)
STEP_OF = {name: THREE_PASSES_STEP for name in VARIANTS if name.startswith("three_passes")}


def fits(shape: Shape) -> bool:
    """Mirrors 09_tf32_wgmma.cu's `takes` for fp32 inputs: TMA rows start 16-byte aligned."""
    return shape.d_model % 4 == 0 and shape.rank % 4 == 0


ODD = (
    Shape(1, 5, 132, 20, 3, 7),  # odd tokens, heads and head_dim; d_model 4 past a 32-deep stage
    Shape(2, 3, 36, 12, 1, 1),  # one head of width 1: GEMM 2 has 2 columns
)
FITTING = tuple(shape for shape in check.SHAPE_MATRIX if fits(shape)) + ODD
QUICK = tuple(shape for shape in check.QUICK_SHAPES if fits(shape)) + ODD
TIMED = (
    ("V2-Lite 512", V2_LITE.with_tokens(1, 512)),
    ("V2-Lite 4096", V2_LITE.with_tokens(1, 4096)),
    ("V2-Lite 8192", V2_LITE.with_tokens(1, 8192)),
    ("V3-TP8 4096", V3_TP8),
    ("V3 4096", V3.with_tokens(1, 4096)),
    ("V3 16384", V3.with_tokens(1, 16384)),
)


def lab_source(name: str) -> Path:
    """The .cu file variant `name` builds from ("step5": solutions/ex04_tensor_cores.cu as it is)."""
    return labkit.edited_source(KERNEL, name, EDITS, "HEAD", BUILD)


def kernel(name: str) -> steps.Kernel:
    """Variant `name` built as the lab builds it (so that builds can be made ahead, in parallel)."""
    return labkit.built_kernel(STEP_OF.get(name, STEP), lab_source(name), f"tf32_{name}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--profile"]:
        labkit.call_for_a_profiler(STEP_OF.get(argv[1], STEP), lab_source(argv[1]), f"tf32_{argv[1]}",
                                   V2_LITE.with_tokens(1, 4096), torch.float32)
        return 0
    quick = argv[:1] == ["--check"]
    names = [name for name in argv if not name.startswith("--")] or list(VARIANTS)
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; the variants are {', '.join(VARIANTS)}")
    sources = {name: lab_source(name) for name in names}
    fp32 = (torch.float32,)
    if quick:
        fit = labkit.build_and_check(STEP, sources, CORRECT, QUICK, "tf32", fp32, STEP_OF)
        return 0 if all(name in fit for name in names if name in CORRECT) else 1
    return labkit.run(STEP, sources, CORRECT, [(label, shape, torch.float32) for label, shape in TIMED],
                      shapes=FITTING, lab="tf32", check_dtypes=fp32, peers={"cuBLAS concat TF32": bench.CublasConcatTf32()},
                      step_of=STEP_OF)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
