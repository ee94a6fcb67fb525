"""Copies of step 4 timed side by side on a GPU, beside eager and cuBLAS: how kernels/NOTES.md
measured its pipelined version against the one before and tried its parameters.

Each variant is kernels/04_vectorized.cu with edits (`lab_source(name)` fails loudly when the
kernel no longer has the text an edit replaces). Those in CORRECT are checked first against
float64 with NaN-poisoned outputs; all are timed in one process on the same inputs, graph
replay, median µs, in interleaved rounds (`bench.time_many`):

    python experiments/step4/lab.py [VARIANT...]     # all of them by default

  base        the committed kernel
  previous    step 4 before its ring and 8 x 4 results per thread (9a2e0e3)
  stages2     a ring of 2 slices instead of up to 4
  stages8     a ring of up to 8 slices (then one block per SM, not two, for V2-Lite in fp32)
  depth16     16-deep slices instead of 8 (half the barriers; the same bytes in flight)
  tokens16    16 tokens per block, 4 x 4 results per thread (twice the blocks)
  no_compute  copies every slice, skips the multiply-adds (timing only: the copies' cost)
  no_copy     issues no copies: multiplies whatever shared memory holds (timing only)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/labkit.py
import labkit  # noqa: E402
from mla_lab.problem import TOY, V2_LITE  # noqa: E402

BUILD = Path(__file__).resolve().parent / "build"
KERNEL = "kernels/04_vectorized.cu"
PREVIOUS_COMMIT = "9a2e0e3"
EDITS = {
    "stages2": (("kMinStages = 2, kMaxStages = 4;", "kMinStages = 2, kMaxStages = 2;"),),
    "stages8": (("kMinStages = 2, kMaxStages = 4;", "kMinStages = 2, kMaxStages = 8;"),),
    "depth16": (("constexpr int kDepth = 8;", "constexpr int kDepth = 16;"),),
    "tokens16": (("constexpr int kTokens = 32;", "constexpr int kTokens = 16;"),
                 ("constexpr int kRows = 8;", "constexpr int kRows = 4;")),
    "no_compute": (("    if (!computes) continue;", "    if (computes || p.tokens > 0) continue;"),),
    "no_copy": (("  auto stage_slice = [&](int slice, int buffer) {\n", "  auto stage_slice = [&](int slice, int buffer) {\n    if (p.tokens > 0) return;\n"),),
}
CORRECT = ("base", "previous", "stages2", "stages8", "depth16", "tokens16")
VARIANTS = ("base", "previous", *EDITS)
TIMED = (("toy fp32", TOY, torch.float32),
         ("v2l-128 fp32", V2_LITE.with_tokens(1, 128), torch.float32),
         ("v2l-4096 fp32", V2_LITE, torch.float32),
         ("v2l-4096 bf16", V2_LITE, torch.bfloat16),
         ("v2l-8192 fp32", V2_LITE.with_tokens(1, 8192), torch.float32))


def lab_source(name: str) -> Path:
    return labkit.edited_source(KERNEL, name, EDITS, PREVIOUS_COMMIT, BUILD)


def main(names: list[str]) -> int:
    return labkit.run(4, {name: lab_source(name) for name in names or VARIANTS}, CORRECT, TIMED)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
