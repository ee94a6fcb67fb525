"""Copies of step 7 timed side by side on a GPU: how kernels/NOTES.md split its time and tried
its alternatives.

Each variant is kernels/07_latency.cu with edits (`lab_source(name)` fails loudly when the kernel
no longer has the text an edit replaces). Those in CORRECT compute the projection and are checked
first; the others compute garbage and are for timing only. All are timed in one process on the
same inputs, graph replay, median µs (`bench.time_fn`):

    python experiments/step7/lab.py [VARIANT...]     # all of them by default

  base        the committed kernel
  previous    the kernel before its threads took two columns each (commit 98d8ac4)
  bulk        sm_90: every whole, aligned row of a slice by one bulk copy (TMA), stages on mbarriers
  empty       returns at once (what a launch of this grid and shared memory costs)
  no_fetch    issues no copies: computes on whatever shared memory holds
  no_compute  copies everything, skips the multiply-adds
  no_store    computes everything, writes no output
  skeleton    neither copies nor multiply-adds: the barriers, the reductions and the stores
  threads256  256 threads per block instead of 512
  tokens16    16 tokens per block instead of 8
  stagger     each block fetches a slice's rows starting at a different row, so that the blocks
              do not all ask the same L2 lines at the same moment (measured slower: NOTES.md)
  timeline    no_store, plus a clock64 mark by thread 0 of every block at each phase boundary,
              written over the output (printed as a per-phase table, then timed like the rest)
"""
import subprocess
import sys
from pathlib import Path

import torch

from mla_lab import bench, build, check, steps
from mla_lab.problem import TOY, V2_LITE, make_inputs

BUILD = Path(__file__).resolve().parent / "build"
# variant -> ((text in kernels/07_latency.cu, what replaces it), ...)
NO_FETCH = ("                      const T* w_up_k, const T* w_up_v, int64_t token0, int tokens_here) {\n",
            "                      const T* w_up_k, const T* w_up_v, int64_t token0, int tokens_here) {\n"
            "  if (g.tokens > 0) return;\n")
NO_COMPUTE = ("    if (group < groups && column < s.columns) {",
              "    if (g.tokens < 0 && group < groups && column < s.columns) {")
NO_STORE = ("      } else if (m < tokens_here) {", "      } else if (m < tokens_here && g.tokens < 0) {")
MARKS = 12  # phase marks per block: issued, then landed / computed / reduced for each slice
TIMELINE = (
    NO_STORE,
    ("  extern __shared__ float4 shared_vectors[];",
     "  extern __shared__ float4 shared_vectors[];\n"
     "  __shared__ long long lab_marks[16];\n"
     "  const long long lab_start = clock64();\n"
     "  unsigned long long lab_global_start, lab_global_end;\n"
     "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(lab_global_start));\n"
     "  int lab_count = 0;\n"
     f"  auto lab_mark = [&] {{ if (threadIdx.x == 0 && lab_count < {MARKS}) lab_marks[lab_count] = clock64() - lab_start; ++lab_count; }};"),
    ("  Sums acc = {};\n", "  lab_mark();\n  Sums acc = {};\n"),
    ("slice q - 1's stage is free\n", "slice q - 1's stage is free\n    lab_mark();\n"),
    ("    if (!s.ends_pass) continue;\n", "    lab_mark();\n    if (!s.ends_pass) continue;\n"),
    ("    // The next write to `partial` ends the next pass, after at least one more barrier above.\n  }\n}\n",
     "    lab_mark();\n  }\n  __syncthreads();\n"
     "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(lab_global_end));\n"
     "  if (threadIdx.x == 0) {\n"
     "    unsigned sm;\n    asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(sm));\n"
     "    long long* row = reinterpret_cast<long long*>(out) + (blockIdx.y * gridDim.x + blockIdx.x) * 16;\n"
     f"    for (int i = 0; i < {MARKS}; ++i) row[i] = i < lab_count ? lab_marks[i] : -1;\n"
     "    row[12] = clock64() - lab_start;\n    row[13] = (long long)lab_global_start;\n"
     "    row[14] = (long long)lab_global_end;\n    row[15] = sm;\n  }\n}\n"),
)
# sm_90 only: every whole, aligned row of a slice comes by one bulk copy (the TMA engine), not
# 16-byte cp.async per thread; each stage completes on an mbarrier that all threads arrive at.
LAB_BAR = "mla::shared_address(&lab_bars[{q} % g.stages])"
BULK = (
    ("template <typename T>\n__device__ void fetch(",
     "__shared__ uint64_t lab_bars[kMaxStages];\n"
     "__device__ __forceinline__ void lab_bulk(void* dst, const void* src, uint32_t bytes, uint32_t bar) {\n"
     "  asm volatile(\"mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\" ::\"r\"(bar), \"r\"(bytes) : \"memory\");\n"
     "  asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\"\n"
     "               ::\"r\"(mla::shared_address(dst)), \"l\"(src), \"r\"(bytes), \"r\"(bar) : \"memory\");\n"
     "}\n"
     "template <typename T>\n__device__ void fetch("),
    ("                      int padded_rows, int padded_columns) {",
     "                      int padded_rows, int padded_columns, uint32_t bar) {"),
    ("    if (r < rows && c + V <= columns && mla::aligned16(to) && mla::aligned16(from)) {",
     "    if (r < rows && columns == padded_columns && columns % V == 0 && mla::aligned16(dst + r * stride) &&\n"
     "        mla::aligned16(src + r * ld)) {\n"
     "      if (c == 0) lab_bulk(dst + r * stride, src + r * ld, uint32_t(columns * sizeof(T)), bar);\n"
     "      continue;\n"
     "    }\n"
     "    if (r < rows && c + V <= columns && mla::aligned16(to) && mla::aligned16(from)) {"),
    ("int64_t token0, int tokens_here) {", "int64_t token0, int tokens_here, uint32_t bar) {"),
    ("          padded_rows, s.columns + odd);", "          padded_rows, s.columns + odd, bar);"),
    ("kTokens, padded_rows);", "kTokens, padded_rows, bar);"),
    ("0 : odd));", "0 : odd), bar);"),
    ("int(end - v0) + odd);", "int(end - v0) + odd, bar);"),
    ("  // The ring: `ahead` slices are requested",
     "  if (threadIdx.x == 0) {\n"
     "    for (int i = 0; i < kMaxStages; ++i)\n"
     "      asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" ::\"r\"(mla::shared_address(&lab_bars[i])), \"r\"(kThreads) : \"memory\");\n"
     "  }\n"
     "  __syncthreads();\n"
     "  auto lab_arrive = [&](int q) {\n"
     f"    asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\" ::\"r\"({LAB_BAR.format(q='q')}) : \"memory\");\n"
     "  };\n"
     "  // The ring: `ahead` slices are requested"),
    ("    issue(schedule[q], stage(q), g, hidden, w_down, w_up_k, w_up_v, token0, tokens_here);\n",
     f"    issue(schedule[q], stage(q), g, hidden, w_down, w_up_k, w_up_v, token0, tokens_here, {LAB_BAR.format(q='q')});\n"
     "    lab_arrive(q);\n"),
    ("      issue(schedule[next], stage(next), g, hidden, w_down, w_up_k, w_up_v, token0, tokens_here);\n",
     f"      issue(schedule[next], stage(next), g, hidden, w_down, w_up_k, w_up_v, token0, tokens_here, {LAB_BAR.format(q='next')});\n"
     "      lab_arrive(next);\n"),
    ("    mla::wait_for_copies(ahead - 1);\n",
     "    mla::wait_for_copies(ahead - 1);\n"
     "    for (uint32_t done = 0; !done;) {\n"
     "      asm volatile(\"{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}\\n\"\n"
     f"                   : \"=r\"(done) : \"r\"({LAB_BAR.format(q='q')}), \"r\"(uint32_t(q / g.stages) & 1) : \"memory\");\n"
     "    }\n"),
)
EDITS = {
    "empty": (("  extern __shared__ float4 shared_vectors[];",
               "  if (g.tokens > 0) return;\n  extern __shared__ float4 shared_vectors[];"),),
    "no_fetch": (NO_FETCH,),
    "no_compute": (NO_COMPUTE,),
    "no_store": (NO_STORE,),
    "skeleton": (NO_FETCH, NO_COMPUTE),
    "timeline": TIMELINE,
    "bulk": BULK,
    "threads256": (("constexpr int kThreads = 512;", "constexpr int kThreads = 256;"),),
    "tokens16": (("constexpr int kTokens = 8;", "constexpr int kTokens = 16;"),),
    "stagger": (("  for (int r = threadIdx.x / runs; r < padded_rows; r += row_step) {\n",
                 "  const int lab_shift = int((blockIdx.x * 37u + blockIdx.y * 101u) % unsigned(padded_rows));\n"
                 "  for (int lab_r = threadIdx.x / runs; lab_r < padded_rows; lab_r += row_step) {\n"
                 "    const int r = (lab_r + lab_shift) % padded_rows;\n"),),
}
SM90_ONLY = ("bulk",)  # variants that compile for Hopper only
PREVIOUS_COMMIT = "98d8ac4"  # one output column per thread, all 512 threads computing
CORRECT = ("base", "previous", "bulk", "threads256", "tokens16", "stagger")  # still compute the projection: checked first
VARIANTS = ("base", "previous", *EDITS)
TIMED = (("toy fp32", TOY, torch.float32), ("toy bf16", TOY, torch.bfloat16),
         ("v2l-128 bf16", V2_LITE.with_tokens(1, 128), torch.bfloat16), ("v2l-4096 bf16", V2_LITE, torch.bfloat16))


def lab_source(name: str) -> Path:
    if name == "previous":
        text = subprocess.run(["git", "show", f"{PREVIOUS_COMMIT}:kernels/07_latency.cu"], check=True,
                              capture_output=True, text=True, cwd=steps.REPO).stdout
    else:
        text = (steps.KERNELS_DIR / "07_latency.cu").read_text()
    for original, replacement in EDITS.get(name, ()):
        if text.count(original) != 1:
            raise RuntimeError(f"{name}: kernels/07_latency.cu no longer has exactly one {original!r}")
        text = text.replace(original, replacement)
    BUILD.mkdir(exist_ok=True)
    path = BUILD / f"07_{name}.cu"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def main(names: list[str]) -> int:
    print(bench.device_line(), flush=True)
    kernels = {}
    for name in names or VARIANTS:
        source = lab_source(name)
        kernels[name] = steps.Kernel(steps.get(7), source, build.build_step(source, f"lab07_{name}", ()))
    for name in (n for n in CORRECT if n in kernels):
        verdicts = check.check_matrix(kernels[name], "cuda", (TOY, *check.QUICK_SHAPES, V2_LITE.with_tokens(1, 128)))
        print(f"{name}: {check.summary(verdicts)}", *(v for v in verdicts if not v.ok), sep="\n  ", flush=True)
    for label, shape, dtype in TIMED:
        inputs = make_inputs(shape, dtype, "cuda", 0)
        out = torch.empty(shape.out_shape, dtype=dtype, device="cuda")
        row = [f"{name} {bench.time_fn(lambda k=k: k(*inputs, shape.heads, out=out), 'graph', name).median_us:.2f}"
               for name, k in kernels.items()]
        print(f"{label:14} " + " | ".join(row), flush=True)
        if "timeline" in kernels:
            print(timeline(kernels["timeline"], inputs, shape, out), flush=True)
    return 0


def timeline(kernel, inputs, shape, out) -> str:
    """The timeline variant's marks, one call: when blocks start and end (globaltimer, ns, from
    the first start), and thread 0's clock64 cycles at each phase boundary (median, max)."""
    marks = out.view(-1).view(torch.int64)
    marks.fill_(-2)
    kernel(*inputs, shape.heads, out=out)
    torch.cuda.synchronize()
    rows = marks[: marks.numel() // 16 * 16].view(-1, 16).cpu()
    rows = rows[rows[:, 13] != -2]
    start, end = rows[:, 13] - rows[:, 13].min(), rows[:, 14] - rows[:, 13].min()
    cycles_per_ns = float((rows[:, 12].double() / (rows[:, 14] - rows[:, 13]).double().clamp_min(1)).median())
    lines = [f"  {len(rows)} blocks on {len(set(rows[:, 15].tolist()))} SMs; globaltimer ns: starts "
             f"{int(start.min())}-{int(start.max())}, ends {int(end.min())}-{int(end.max())}; "
             f"about {cycles_per_ns:.2f} cycles/ns"]
    names = ["issued"] + [f"{what} {q}" for q in range(MARKS) for what in ("landed", "computed", "reduced")]
    for i in range(MARKS):
        column = rows[:, i]
        if bool((column < 0).all()):
            break
        column = column[column >= 0].double()
        lines.append(f"  {names[i]:12} cycles median {float(column.median()):8.0f}  max {float(column.max()):8.0f}")
    total = rows[:, 12].double()
    lines.append(f"  {'end':12} cycles median {float(total.median()):8.0f}  max {float(total.max()):8.0f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
