"""Copies of step 7 timed side by side on a GPU: how kernels/NOTES.md split its time and tried
its alternatives.

Each variant is kernels/07_latency.cu with edits (`lab_source(name)` fails loudly when the kernel
no longer has the text an edit replaces). Those in CORRECT compute the projection and are checked
first; the others compute garbage and are for timing only. All are timed in one process on the
same inputs, graph replay, median µs, in interleaved rounds (`bench.compare`, which checks those
in CORRECT again on the timed inputs):

    python experiments/step7/lab.py [VARIANT...]     # all of them by default

  base        the committed kernel
  previous    the kernel before its copies were issued by shifts and pointer increments (020cef4)
  at_7a5549b  256 threads that only issue copies and 256 that only compute, meeting on mbarriers
              per slice (stop 24's experiment: V2-Lite 28-33 % faster; the toy as fast in fp32, 4 % slower in bf16)
  empty       returns at once (what a launch of this grid and shared memory costs)
  empty_nosmem  the same, launched without dynamic shared memory
  empty_smemN   the same, launched with N KiB of it (48, 100, 160, 220)
  no_fetch    issues no copies: computes on whatever shared memory holds
  no_compute  copies everything, skips the multiply-adds
  no_store    computes everything, writes no output
  skeleton    neither copies nor multiply-adds: the barriers, the reductions and the stores
  threads256  256 threads per block instead of 512
  tokens16    16 tokens per block instead of 8
  computing512  all 512 threads multiply (32 KiB of partial sums), not 256
  regs80      ptxas may give a thread 80 registers, not 128
  issuers64, issuers128, issuers256   only the first N threads work out and issue the copies
  unroll2     the multiply-add loop unrolled twice (two depth units' loads in flight)
  issuers128_unroll2   both
  tokens4     4 tokens per block instead of 8
  ring        the toy too through the 8-stage ring of up to 12 KB slices, not all at once
  ring6k      the same with slices of up to 6 KB
  empty_threads128  the empty launch with 128 threads per block
  empty_grid1       the empty launch of one block
  timeline    no_store, plus a clock64 mark by thread 0 of every block at each phase boundary,
              written over the output (printed as a per-phase table, then timed like the rest)

Two variants NOTES.md measured slower, `stagger` (each block starts a slice at a different row)
and `bulk` (TMA bulk copies, sm_90), edit the kernel as it was before its copies changed: run
them in a checkout of that commit (`git worktree add ../mla-lab-020cef4 020cef4`).
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/labkit.py
import labkit  # noqa: E402
from mla_lab.problem import TOY, V2_LITE, make_inputs  # noqa: E402

BUILD = Path(__file__).resolve().parent / "build"
# variant -> ((text in kernels/07_latency.cu, what replaces it), ...)
NO_FETCH = ("int64_t token0, int tokens_here) {\n", "int64_t token0, int tokens_here) {\n  if (g.tokens > 0) return;\n")
NO_COMPUTE = ("    if (w.group < w.groups && w.column < s.columns) {",
              "    if (g.tokens < 0 && w.group < w.groups && w.column < s.columns) {")
NO_STORE = ("      } else if (m < tokens_here) {", "      } else if (m < tokens_here && g.tokens < 0) {")
EMPTY = ("  extern __shared__ float4 shared_vectors[];",
         "  if (g.tokens > 0) return;\n  extern __shared__ float4 shared_vectors[];")
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


def issuers(n: int) -> tuple:
    """Only the first n threads issue copies (and work out where): the rest go straight to the barrier."""
    return (("constexpr int kThreads = 512;", f"constexpr int kThreads = 512;\nconstexpr int kIssuers = {n};"),
            ("kThreads >> runs_shift};", "kIssuers >> runs_shift};"),
            ("    issue(s, stage(s), g, hidden, w_down, w_up_k, w_up_v, token0, tokens_here);",
             "    if (threadIdx.x < kIssuers) issue(s, stage(s), g, hidden, w_down, w_up_k, w_up_v, token0, tokens_here);"),
            ("mla::round_up(p.d_model, 8) <= kThreads * kRunElements) {", "mla::round_up(p.d_model, 8) <= kIssuers * kRunElements) {"))


UNROLL2 = ("  for (int k = group * kUnit; k < rows; k += groups * kUnit) {",
           "#pragma unroll 2\n  for (int k = group * kUnit; k < rows; k += groups * kUnit) {")
RING = ("  if (passes <= kMaxStages && passes * whole", "  if (g.tokens < 0 && passes <= kMaxStages && passes * whole")
EDITS = {
    "empty": (EMPTY,),
    "no_fetch": (NO_FETCH,),
    "no_compute": (NO_COMPUTE,),
    "no_store": (NO_STORE,),
    "skeleton": (NO_FETCH, NO_COMPUTE),
    "timeline": TIMELINE,
    "threads256": (("constexpr int kThreads = 512;", "constexpr int kThreads = 256;"),),
    "tokens16": (("constexpr int kTokens = 8;", "constexpr int kTokens = 16;"),),
    "computing512": (("constexpr int kComputing = 256;", "constexpr int kComputing = 512;"),),
    "regs80": (("__maxnreg__(128)", "__maxnreg__(80)"),),
    **{f"issuers{n}": issuers(n) for n in (64, 128, 256)},
    "unroll2": (UNROLL2,),
    "issuers128_unroll2": (*issuers(128), UNROLL2),
    "tokens4": (("constexpr int kTokens = 8;", "constexpr int kTokens = 4;"),),
    "ring": (RING,),
    "ring6k": (RING, ("std::min<int64_t>(12 * 1024, room / kMaxStages)", "std::min<int64_t>(6 * 1024, room / kMaxStages)")),
    "empty_threads128": (EMPTY, ("constexpr int kThreads = 512;", "constexpr int kThreads = 128;")),
    "empty_grid1": (EMPTY, ("const dim3 grid{unsigned(token_tiles), unsigned(split.splits)};", "const dim3 grid{1, 1};")),
    "empty_nosmem": (EMPTY, ("kThreads, shared_bytes, stream>>>(", "kThreads, 0, stream>>>(")),
    **{f"empty_smem{kib}": (EMPTY, ("  const size_t shared_bytes = fixed_bytes + size_t(g.stages) * g.stage_elements * sizeof(T);",
                                    f"  const size_t shared_bytes = {kib} * 1024;"))
       for kib in (48, 100, 160, 220)},
}
PREVIOUS_COMMIT = "020cef4"  # copies placed by divisions, alignment tested per row
CORRECT = ("base", "previous", "threads256", "tokens16", "computing512", "regs80", "issuers64", "issuers128", "issuers256",
           "unroll2", "issuers128_unroll2", "tokens4", "ring", "ring6k", "at_7a5549b")  # checked first
VARIANTS = ("base", "previous", "at_7a5549b", *EDITS)
TIMED = (("toy fp32", TOY, torch.float32), ("toy bf16", TOY, torch.bfloat16),
         ("v2l-128 bf16", V2_LITE.with_tokens(1, 128), torch.bfloat16), ("v2l-4096 bf16", V2_LITE, torch.bfloat16))


def lab_source(name: str) -> Path:
    return labkit.edited_source("kernels/07_latency.cu", name, EDITS, PREVIOUS_COMMIT, BUILD)


def main(names: list[str]) -> int:
    def print_timeline(kernels, shape, dtype):
        if "timeline" in kernels:
            inputs = make_inputs(shape, dtype, "cuda", 0)
            out = torch.empty(shape.out_shape, dtype=dtype, device="cuda")
            print(timeline(kernels["timeline"], inputs, shape, out), flush=True)

    return labkit.run(7, {name: lab_source(name) for name in names or VARIANTS}, CORRECT, TIMED,
                      with_peers=False, digits=2, after_row=print_timeline)

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
