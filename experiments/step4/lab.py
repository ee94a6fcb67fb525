"""Copies of step 4 timed side by side on a GPU, beside eager and cuBLAS: how kernels/NOTES.md
measured its pipelined version against the one before and tried its parameters.

Each variant is kernels/04_vectorized.cu with edits (`lab_source(name)` fails loudly when the
kernel no longer has the text an edit replaces). Those in CORRECT are checked first against
float64 with NaN-poisoned outputs; all are timed in one process on the same inputs, graph
replay, median µs, in interleaved rounds (`bench.compare`, which checks those in CORRECT
again on the timed inputs):

    python experiments/step4/lab.py [VARIANT...]     # all of them by default
    python experiments/step4/lab.py base at_aca0ad2  # or the kernel as any commit had it

  base        the committed kernel
  previous    step 4 before fp32 read its A rows 2 depths at a time (100022e: 4, as bf16 does)
  at_6121cbf  step 4 before its double buffer: a ring of 2 to 4 slices, its depth chosen at run time
  at_aca0ad2  step 4 before its warps spread over tokens: all lanes of a warp on the same 8 tokens,
              8 warps, 32 x 256 tiles, 8-deep slices, two blocks per SM where they fit
  threads256  8 warps of 8 x 8 results per thread (64 columns a warp; 166-239 registers)
  depth8      8-deep slices instead of 16 (what fp32 runs on an Ada GPU up to rank 512 or so)
  shallow     slices one 16-byte run deep: 4 in fp32 (Ada's fp32 at rank 640), 8 in bf16
  depth32     32-deep slices (until stop 23, when fp32 read A 4 depths at a time, they spilled)
  no_pad      the hidden tile's staged rows unpadded (fp32 16 deep: 64 bytes apart, 2-way conflicts)
  bf16_pairs  bf16 too reads A 2 depths at a time (fp32 does: fewer registers, twice A's reads)
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
PREVIOUS_COMMIT = "100022e"
EDITS = {
    "depth8": (("return launch_deepest<T, kDepth>(p, stream);", "return launch_deepest<T, 8>(p, stream);"),),
    "shallow": (("return launch_deepest<T, kDepth>(p, stream);", "return launch_deepest<T, kVector<T>>(p, stream);"),),
    "depth32": (("constexpr int kDepth = 16;", "constexpr int kDepth = 32;"),),
    "no_pad": (("kSliceDepth * sizeof(T) % 64 == 0 ? kSliceDepth + kVector<T> : kSliceDepth;", "kSliceDepth;"),),
    "threads256": (("constexpr int kThreads = 512; ", "constexpr int kThreads = 256; "),),
    "bf16_pairs": (("constexpr int kADepths = sizeof(T) == sizeof(float) ? 2 : 4;", "constexpr int kADepths = 2;"),
                   ("  static_assert(kDepths == 4, \"bf16 rows are read 4 depths at a time\");\n  return read_four(p);",
                    "  const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(p);\n"
                    "  return make_float4(__low2float(v), __high2float(v), 0.0f, 0.0f);")),
    "no_compute": (("    if (!computes) continue;", "    if (computes || p.tokens > 0) continue;"),),
    "no_copy": (("  auto stage_slice = [&](int slice, int buffer) {\n", "  auto stage_slice = [&](int slice, int buffer) {\n    if (p.tokens > 0) return;\n"),),
}
CORRECT = ("base", "previous", "threads256", "depth8", "shallow", "depth32", "no_pad", "bf16_pairs", "at_aca0ad2")
VARIANTS = ("base", "previous", "at_aca0ad2", *EDITS)
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
