"""Copies of step 5 timed side by side on a GPU, beside eager and cuBLAS: how kernels/NOTES.md
measured its copies planned once per tile against the version before, and what else it tried
(the fp32 (TF32) experiments of stop 23, measured slower, are in commits of their own, built here
as at_<commit>; each of those commits' lab has that experiment's variants).

Each variant is solutions/ex04_tensor_cores.cu with edits (`lab_source(name)` fails loudly when
the kernel no longer has the text an edit replaces). Those in CORRECT are checked first against
float64 with NaN-poisoned outputs; all are timed in one process on the same inputs, graph
replay, median µs, in interleaved rounds (`bench.compare`, which checks those in CORRECT
again on the timed inputs):

    python experiments/step5/lab.py [VARIANT...]     # all of them by default

  base         the committed kernel
  previous     step 5 before its copies were planned once per tile (b68aaff)
  at_4234df2   TF32 fragments read whole: the transposed tile, k and columns in the fragments'
               order (each fragment register pair one 8-byte read), slices rounded to TF32 once
               in place as they land (its lab: round_in_registers, no_rounding)
  at_87dd120   fp32 slices 16 deep instead of 32: 4 stages instead of 2 at V2-Lite on an H200
               (its lab: fp32_slice8, bf16_slice32)
  fp32_tile32  fp32 without the 64-token tile (before: 32 tokens x 128 columns, 4 warps, at most)
  columns128   the 64-token tile 128 columns wide, 8 warps (the committed one: 256 and 16; each
               slice of the hidden tile used half as often, half the warps per SM)
  stages3      a ring of at most 3 slices instead of 8
  no_compute   copies every slice, skips the mma loop (timing only: the copies' cost)
  no_copy      issues no copies: multiplies whatever shared memory holds (timing only)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/labkit.py
import labkit  # noqa: E402
from mla_lab.problem import TOY, V2_LITE  # noqa: E402

BUILD = Path(__file__).resolve().parent / "build"
KERNEL = "solutions/ex04_tensor_cores.cu"
PREVIOUS_COMMIT = "b68aaff"
EDITS = {
    "fp32_tile32": (("  if (suits<Tile64<T>>(p)) return", "  if (sizeof(T) == 2 && suits<Tile64<T>>(p)) return"),),
    "columns128": (("using Tile64 = Config<T, 64, 256, 2, 8>;", "using Tile64 = Config<T, 64, 128, 2, 4>;"),),
    "stages3": (("kMinStages = 2, kMaxStages = 8;", "kMinStages = 2, kMaxStages = 3;"),),
    "no_compute": (("    drain = drain + 1 == stages ? 0 : drain + 1;\n",
                    "    drain = drain + 1 == stages ? 0 : drain + 1;\n    if (p.tokens > 0) continue;\n"),),
    "no_copy": (("  auto stage_slice = [&](int slice, int buffer) {\n",
                 "  auto stage_slice = [&](int slice, int buffer) {\n    if (p.tokens > 0) return;\n"),),
}
CORRECT = ("base", "previous", "at_4234df2", "at_87dd120", "fp32_tile32", "columns128", "stages3")
VARIANTS = ("base", "previous", "at_4234df2", "at_87dd120", *EDITS)
TIMED = (("toy fp32", TOY, torch.float32),
         ("toy bf16", TOY, torch.bfloat16),
         ("v2l-128 bf16", V2_LITE.with_tokens(1, 128), torch.bfloat16),
         ("v2l-512 fp32", V2_LITE.with_tokens(1, 512), torch.float32),
         ("v2l-2048 fp32", V2_LITE.with_tokens(1, 2048), torch.float32),
         ("v2l-4096 fp32", V2_LITE, torch.float32),
         ("v2l-4096 bf16", V2_LITE, torch.bfloat16),
         ("v2l-8192 fp32", V2_LITE.with_tokens(1, 8192), torch.float32),
         ("v2l-8192 bf16", V2_LITE.with_tokens(1, 8192), torch.bfloat16))


def lab_source(name: str) -> Path:
    return labkit.edited_source(KERNEL, name, EDITS, PREVIOUS_COMMIT, BUILD)


def main(names: list[str]) -> int:
    return labkit.run(5, {name: lab_source(name) for name in names or VARIANTS}, CORRECT, TIMED)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
