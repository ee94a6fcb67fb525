"""Step 7 with one part left out at a time, timed on a GPU: how kernels/NOTES.md split its time.

Each variant is kernels/07_latency.cu with one edit (`lab_source(name)` fails loudly when the
kernel no longer has the text an edit replaces). Except "base", the variants compute garbage and
are for timing only: they are not checked. All are timed in one process on the same inputs, graph
replay, median µs (`bench.time_fn`):

    python experiments/step7/lab.py

  base        the committed kernel
  empty       returns at once (what a launch of this grid and shared memory costs)
  no_fetch    issues no copies: computes on whatever shared memory holds
  no_compute  copies everything, skips the multiply-adds
  no_store    computes everything, writes no output
"""
import sys
from pathlib import Path

import torch

from mla_lab import bench, build, steps
from mla_lab.problem import TOY, V2_LITE, make_inputs

BUILD = Path(__file__).resolve().parent / "build"
# variant -> (text in kernels/07_latency.cu, what replaces it)
EDITS = {
    "empty": ("  extern __shared__ float4 shared_vectors[];",
              "  if (g.tokens > 0) return;\n  extern __shared__ float4 shared_vectors[];"),
    "no_fetch": ("                      const T* w_up_k, const T* w_up_v, int64_t token0, int tokens_here) {\n",
                 "                      const T* w_up_k, const T* w_up_v, int64_t token0, int tokens_here) {\n"
                 "  if (g.tokens > 0) return;\n"),
    "no_compute": ("    if (group < groups && column < s.columns) {",
                   "    if (g.tokens < 0 && group < groups && column < s.columns) {"),
    "no_store": ("      } else if (m < tokens_here) {", "      } else if (m < tokens_here && g.tokens < 0) {"),
}
VARIANTS = ("base", *EDITS)
TIMED = (("toy fp32", TOY, torch.float32), ("toy bf16", TOY, torch.bfloat16),
         ("v2l-128 bf16", V2_LITE.with_tokens(1, 128), torch.bfloat16), ("v2l-4096 bf16", V2_LITE, torch.bfloat16))


def lab_source(name: str) -> Path:
    text = (steps.KERNELS_DIR / "07_latency.cu").read_text()
    if name != "base":
        original, replacement = EDITS[name]
        if text.count(original) != 1:
            raise RuntimeError(f"{name}: kernels/07_latency.cu no longer has exactly one {original!r}")
        text = text.replace(original, replacement)
    BUILD.mkdir(exist_ok=True)
    path = BUILD / f"07_{name}.cu"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def main() -> int:
    print(bench.device_line(), flush=True)
    kernels = {}
    for name in VARIANTS:
        source = lab_source(name)
        kernels[name] = steps.Kernel(steps.get(7), source, build.build_step(source, f"lab07_{name}", ()))
    for label, shape, dtype in TIMED:
        inputs = make_inputs(shape, dtype, "cuda", 0)
        out = torch.empty(shape.out_shape, dtype=dtype, device="cuda")
        row = [f"{name} {bench.time_fn(lambda k=k: k(*inputs, shape.heads, out=out), 'graph', name).median_us:.2f}"
               for name, k in kernels.items()]
        print(f"{label:14} " + " | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
