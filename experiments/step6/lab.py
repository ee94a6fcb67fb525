"""Step 6 variants side by side on a GPU: how kernels/NOTES.md's A/B tables were measured.

The variants are kernels/06_hopper.cu with compile-time switches that each undo one measured choice
or try one idea; `lab_source()` writes that copy (it fails loudly if the kernel no longer has the
text a switch edits). Each variant is checked against the float64 oracle (fresh inputs,
NaN-poisoned output) in its own process, so a hang costs one variant, then all are timed in one
process on the same inputs by `bench.compare` (each output checked on them first, but the GARBAGE
variants'), graph replay, beside cuBLAS and eager, in interleaved rounds:

    python experiments/step6/lab.py check VARIANT          # exit status 0 when correct
    python experiments/step6/lab.py time VARIANT...        # median µs (10th-90th percentile)
    python experiments/step6/lab.py timeline [VARIANT]     # per-block phases at the real sizes
    python experiments/step6/lab.py VARIANT B S D R H HD   # one check, for compute-sanitizer

"previous" is the kernel as committed before its latest change (PREVIOUS_COMMIT, by git show);
"xchg_w2" is the committed kernel (the name it had in NOTES.md's stop-12 table).
"""
import ctypes
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # experiments/labkit.py
import labkit  # noqa: E402
from mla_lab import bench, build, check, steps  # noqa: E402
from mla_lab.problem import TOY, V2_LITE, V3, V3_TP8, Shape, make_inputs  # noqa: E402

BUILD = Path(__file__).resolve().parent / "build"
PREVIOUS_COMMIT = "fa31c3c"
# switch -> (text in kernels/06_hopper.cu, what replaces it under #ifdef switch)
SWITCHES = {
    "LAB_GEMM1_IN_FLIGHT": ("run_slots(down_ring, pass * down_chunks, down_chunks, 1, std::false_type{}, [&]",
                            "run_slots(down_ring, pass * down_chunks, down_chunks, 1, std::true_type{}, [&]"),
    "LAB_GEMM2_DRAIN": ("run_slots(up_ring, index * up_stages, up_stages, 2, std::true_type{}, [&]",
                        "run_slots(up_ring, index * up_stages, up_stages, 2, std::false_type{}, [&]"),
    "LAB_LATE_TURN": ("    }, pass_turn);\n", "    }, [] {});\n    pass_turn();\n"),
    "LAB_NO_EXCHANGE": ("plan_launch(p, config, p->workspace != nullptr)", "plan_launch(p, config, false)"),
}
# An idea measured wrong (kernels/NOTES.md, "Staggered weight tiles"): every block streams the
# same weights in the same order, so all SMs ask the same few L2 lines at once. The stagger
# switches start each token tile at a different output tile (and w_down chunk) to spread them.
STAGGER_SWITCHES = {
    "LAB_STAGGER_DOWN": ("        const int pass = it / down_chunks, chunk = it % down_chunks;\n",
                         "        const int pass = it / down_chunks, chunk = int((it % down_chunks + token_tile) % down_chunks);\n"),
    "LAB_STAGGER_UP_LOADS": (
        "        const int tile = first_tile + it / up_stages * tile_step, depth = it % up_stages;\n",
        "        const int lab_tiles = max(0, (output_tiles - first_tile + tile_step - 1) / tile_step);\n"
        "        const int tile = first_tile + tile_step * int((it / up_stages + token_tile) % lab_tiles);\n"
        "        const int depth = it % up_stages;\n"),
    "LAB_STAGGER_UP_MATH": (
        "  for (int tile = first_tile, index = 0; tile < output_tiles; tile += tile_step, ++index) {\n"
        "    if (index % 2 != consumer) continue;\n",
        "  const int lab_tiles = max(0, (output_tiles - first_tile + tile_step - 1) / tile_step);\n"
        "  for (int index = 0; index < lab_tiles; ++index) {\n"
        "    if (index % 2 != consumer) continue;\n"
        "    const int tile = first_tile + tile_step * int((index + token_tile) % lab_tiles);\n"),
}
SWITCHES.update(STAGGER_SWITCHES)
# Marks for `timeline`: per block (the first MARK_ROWS blocks), globaltimer (ns) at the start and
# at each consumer's end, and clock64 at the phase boundaries, read back through lab_read_marks
# (ctypes). Column i is mark i of the kernel's LAB_MARK(i, ...).
MARK_COLUMNS = ("start_ns", "start", "gemm1_done", "cluster_slices_in", "latent_loaded",
                "gemm2_done_0", "gemm2_done_1", "end_ns_0", "end_ns_1", "writers_counted",
                "cluster_barrier_met", "slice_sent")
MARK_ROWS = 4096
TIMELINE_SWITCHES = {
    "LAB_TIMELINE_MARKS": (
        "__global__ void __launch_bounds__(kThreads, 1)\n",
        f"__device__ long long lab_marks[{MARK_ROWS}][{len(MARK_COLUMNS)}];\n"
        "__device__ __forceinline__ long long lab_ns() {\n"
        "  long long t;\n  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n  return t;\n}\n"
        f"#define LAB_MARK(i, value) do {{ if (blockIdx.x < {MARK_ROWS}) lab_marks[blockIdx.x][i] = (value); }} while (0)\n"
        "__global__ void __launch_bounds__(kThreads, 1)\n"),
    "LAB_TIMELINE_READER": (
        'extern "C" size_t mla_workspace_bytes(const MlaProblem* p) {\n',
        'extern "C" int lab_clear_marks() {\n  void* marks = nullptr;\n'
        '  cudaGetSymbolAddress(&marks, lab_marks);\n  return int(cudaMemset(marks, 0xff, sizeof(lab_marks)));\n}\n'
        'extern "C" int lab_read_marks(long long* host) {\n'
        '  return int(cudaMemcpyFromSymbol(host, lab_marks, sizeof(lab_marks)));\n}\n'
        'extern "C" size_t mla_workspace_bytes(const MlaProblem* p) {\n'),
    "LAB_TIMELINE_START": (
        "  extern __shared__ uint8_t shared_raw[];\n",
        "  extern __shared__ uint8_t shared_raw[];\n"
        "  if (threadIdx.x == 0) { LAB_MARK(0, lab_ns()); LAB_MARK(1, clock64()); }\n"),
    "LAB_TIMELINE_WRITERS": (
        "        wait_for_writers(s.ready + token_tile, unsigned(s.groups) * blocks);\n",
        "        wait_for_writers(s.ready + token_tile, unsigned(s.groups) * blocks);\n"
        "        LAB_MARK(9, clock64());\n"),
    "LAB_TIMELINE_GEMM1": (
        "  if (s.exchange) {  // this block's slice is in global memory: count it, once all 256 threads wrote\n",
        "  if (threadIdx.x == 128) LAB_MARK(2, clock64());\n"
        "  if (s.exchange) {  // this block's slice is in global memory: count it, once all 256 threads wrote\n"),
    "LAB_TIMELINE_LATENT": (
        "  if (s.exchange) barrier_wait(latent_loaded, 0);\n",
        "  if (threadIdx.x == 128) LAB_MARK(3, clock64());\n"
        "  if (s.exchange) barrier_wait(latent_loaded, 0);\n"
        "  if (threadIdx.x == 128) LAB_MARK(4, clock64());\n"),
    "LAB_TIMELINE_FIRST_BARRIER": (
        "  cluster_wait();\n#pragma unroll\n",
        "  cluster_wait();\n  if (threadIdx.x == 128) LAB_MARK(10, clock64());\n#pragma unroll\n"),
    "LAB_TIMELINE_WRITTEN": (
        "  barrier_wait(latent_from_cluster, 0);\n",
        "  if (threadIdx.x == 128) LAB_MARK(11, clock64());\n  barrier_wait(latent_from_cluster, 0);\n"),
    "LAB_TIMELINE_END": (
        "  // This block's shared memory must outlive the copies that read it.\n",
        "  if (threadIdx.x % 128 == 0) { LAB_MARK(5 + consumer, clock64()); LAB_MARK(7 + consumer, lab_ns()); }\n"
        "  // This block's shared memory must outlive the copies that read it.\n"),
}
SWITCHES.update(TIMELINE_SWITCHES)
# Texts several switches edit: GEMM 2's two output stores, one 16-byte output store, and a 0 that
# nvcc cannot see through (it comes from PTX), for switches that must keep work nvcc would drop.
GEMM2_STORES = ("    store_tile(upper, out, token0, s.tokens, columns, column0);\n"
                "    store_tile(lower, out, token0 + 64, s.tokens, columns, column0);\n")
OUTPUT_STORE = ("        mla::store_whole<mla::Space::kGlobal>(out + token * columns + column0 + 8 * (4 * group + quad_lane),\n"
                "                                              make_uint4(v[0], v[1], v[2], v[3]));\n")
RUNTIME_ZERO = "    int lab_zero;\n    asm volatile(\"mov.u32 %0, 0;\" : \"=r\"(lab_zero));\n"


def output_store_as(instruction: str) -> str:
    """OUTPUT_STORE written as the PTX store `instruction` (e.g. st.global.cs.v4.b32)."""
    return (f"        asm volatile(\"{instruction} [%0], {{%1, %2, %3, %4}};\"\n"
            "                     ::\"l\"(out + token * columns + column0 + 8 * (4 * group + quad_lane)),\n"
            "                     \"r\"(v[0]), \"r\"(v[1]), \"r\"(v[2]), \"r\"(v[3]) : \"memory\");\n")


# Timing only (the output is garbage), what the output stores cost: GEMM 2's tiles computed,
# packed and shuffled as for storing, but every store predicated off by a token count of 0 from
# PTX. Leaving the stores out instead (stop 19's `no_store`) let ptxas drop the wgmmas whose
# results went unused, 15 of 24 (tests/test_kernel_sources.py now counts them in every variant).
SWITCHES["LAB_NO_STG"] = (GEMM2_STORES, RUNTIME_ZERO +
                          "    store_tile(upper, out, token0, lab_zero, columns, column0);\n"
                          "    store_tile(lower, out, token0 + 64, lab_zero, columns, column0);\n")
# GEMM 1's ring: every slot and the latent tile (committed), only the kStages slots (`ring3`, as
# before it borrowed the latent tile), or two borrowed slots (`ring5`); and GEMM 2's ring of 2.
SWITCHES["LAB_GEMM1_RING3"] = ("constexpr int kGemm1Depth = kStages + kLatentBytes / kStageBytes;",
                               "constexpr int kGemm1Depth = kStages;")
SWITCHES["LAB_GEMM1_RING5"] = ("constexpr int kGemm1Depth = kStages + kLatentBytes / kStageBytes;",
                               "constexpr int kGemm1Depth = kStages + 2;")
SWITCHES["LAB_STAGES2"] = ("constexpr int kStages = 3;", "constexpr int kStages = 2;")
# Timing only, where the output stores cost (stop 19): every tile stored over its token tile's
# first (the same 32 KB again and again: L2 hits, no DRAM traffic). The zero comes from PTX so
# that nvcc cannot hoist the tiles' addresses out of the loop (a constant 0 or first_tile made it
# spill).
SWITCHES["LAB_STORE_SAME"] = ("    const int64_t column0 = int64_t(tile) * kColumns;\n",
                              RUNTIME_ZERO + "    const int64_t column0 = int64_t(tile) * kColumns * lab_zero;\n")
# L2 eviction hints: output stores marked evict-first (st.global.cs), so the 33 MB to 1 GB of
# output pushes fewer weight lines out of L2; GEMM 2's weight tiles loaded evict-last, since every
# token tile reads them again.
SWITCHES["LAB_STORE_CS"] = (OUTPUT_STORE, output_store_as("st.global.cs.v4.b32"))
# Stop 19's two store changes one at a time: the output stores as plain uint4 assignments again
# (nvcc splits one in four of them into 4-byte stores), GEMM 1's scratch writes as 4-byte stores again.
SWITCHES["LAB_OLD_STORES"] = (
    OUTPUT_STORE,
    "        *reinterpret_cast<uint4*>(out + token * columns + column0 + 8 * (4 * group + quad_lane)) =\n"
    "            make_uint4(v[0], v[1], v[2], v[3]);\n")
SWITCHES["LAB_OLD_SCRATCH"] = (
    "    if (s.exchange) {\n"
    "      const int64_t scratch_columns = int64_t(s.latent_tiles) * kColumns;\n"
    "      store_tile(latent_pairs[pass], s.scratch, token0 + consumer * 64, token0 + kTokens, scratch_columns,\n"
    "                 (first_latent_tile + pass) * kColumns);\n"
    "    }\n",
    "    if (s.exchange) {\n"
    "      for_each_pair([&](int row, int column, int pair) {\n"
    "        *reinterpret_cast<uint32_t*>(s.scratch + (token0 + consumer * 64 + row) * s.latent_tiles * kColumns +\n"
    "                                     (first_latent_tile + pass) * kColumns + column) = latent_pairs[pass][pair];\n"
    "      });\n"
    "    }\n")
# The exchange's first 1.8 µs (stop 21's timeline: from GEMM 1's end to the cluster barrier met)
# hold a __threadfence() (the scratch writes reaching the GPU), the writer count and the cluster
# barrier, one after the other. `arrive_early`: a block arrives at the cluster barrier as soon as
# its GEMM 1 is done (all the barrier guards is the latent tile's reuse), so the barrier's
# latency overlaps the fence. `no_fence`: no __threadfence(); the count's red.release.gpu after
# bar.sync, which orders the block's scratch writes before it, is the pattern CUTLASS's
# semaphores use. Timing experiments: the check shows they compute right, not that the
# memory-model argument holds on every GPU.
SWITCHES["LAB_EARLY_ARRIVE"] = ("    __threadfence();\n", "    cluster_arrive();\n    __threadfence();\n")
SWITCHES["LAB_EARLY_ARRIVE_ONLY"] = ("  }\n  cluster_arrive();\n", "  }\n  if (!s.exchange) cluster_arrive();\n")
SWITCHES["LAB_NO_FENCE"] = ("namespace {\n", "namespace {\n#define __threadfence() do { } while (0)\n")
SWITCHES["LAB_UP_KEEP"] = (
    "          tma_load(up_ring.slot(it) + half * kUpBoxBytes, is_k ? up_k_map : up_v_map,\n"
    "                   int(is_k ? column : column - s.width), depth * kUpDepth, up_ring.full_bar(it));\n",
    "          uint64_t lab_policy;\n"
    "          asm volatile(\"createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\" : \"=l\"(lab_policy));\n"
    "          asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint\"\n"
    "                       \" [%0], [%1, {%2, %3}], [%4], %5;\"\n"
    "                       ::\"r\"(up_ring.slot(it) + half * kUpBoxBytes),\n"
    "                       \"l\"(reinterpret_cast<uint64_t>(is_k ? &up_k_map : &up_v_map)),\n"
    "                       \"r\"(int(is_k ? column : column - s.width)), \"r\"(depth * kUpDepth),\n"
    "                       \"r\"(up_ring.full_bar(it)), \"l\"(lab_policy) : \"memory\");\n")
# The output stores marked L1::no_allocate.
SWITCHES["LAB_STORE_NA"] = (OUTPUT_STORE, output_store_as("st.global.L1::no_allocate.v4.b32"))
# GEMM 2's output by TMA (the idea to measure after the stores above; kernels/NOTES.md, stop 20):
# a warpgroup keeps the ring slot its tile's last weights came in, writes the finished 128 x 128
# tile into it as bf16 (swizzled like the latent tile, which is how TMA reads two 64-column
# boxes; 4-byte stores, conflict-free), and one thread stores it with two bulk tensor copies, then
# hands the slot back once they have read it. The threads go on to their next tile at once
# instead of issuing 16 stores of 16 bytes each from registers.
TMA_STORE_SWITCHES = {
    "LAB_TMA_STORE_MAP_PARAM": (
        "                  const __grid_constant__ CUtensorMap scratch_map, __nv_bfloat16* __restrict__ out,\n",
        "                  const __grid_constant__ CUtensorMap scratch_map, const __grid_constant__ CUtensorMap out_map,\n"
        "                  __nv_bfloat16* __restrict__ out,\n"),
    "LAB_TMA_STORE_MAP_MADE": (
        "  CUtensorMap hidden_map, down_map, up_k_map, up_v_map, scratch_map = {};\n"
        "  if (!make_map(&hidden_map, p->hidden, p->tokens, p->d_model, kTokens) ||\n",
        "  CUtensorMap hidden_map, down_map, up_k_map, up_v_map, scratch_map = {}, out_map;\n"
        "  if (!make_map(&hidden_map, p->hidden, p->tokens, p->d_model, kTokens) ||\n"
        "      !make_map(&out_map, p->out, p->tokens, 2 * width, kTokens) ||\n"),
    "LAB_TMA_STORE_MAP_PASSED": (
        "  err = cudaLaunchKernelEx(&config, hopper_kernel, hidden_map, down_map, up_k_map, up_v_map, scratch_map,\n",
        "  err = cudaLaunchKernelEx(&config, hopper_kernel, hidden_map, down_map, up_k_map, up_v_map, scratch_map,\n"
        "                           out_map,\n"),
    # GEMM 2 is the only caller of run_slots with one slot in flight: its last slot stays taken.
    "LAB_TMA_STORE_KEEP_LAST_SLOT": (
        "      wgmma_wait<0>();\n"
        "      if (warp_leader) barrier_arrive(ring.empty_bar(first + slots - 1), arrivals_per_warp);\n",
        "      wgmma_wait<0>();\n"),
    "LAB_TMA_STORE_TILE": (
        "    fence_registers(lower);\n",
        "    fence_registers(lower);\n"
        "    {\n"
        "      const int last = (index + 1) * up_stages - 1;\n"
        "      const uint32_t staging = up_ring.slot(last);\n"
        "      for_each_pair([&](int row, int column, int pair) {\n"
        "        asm volatile(\"st.shared.u32 [%0], %1;\" ::\"r\"(staging + latent_offset(row, column)),\n"
        "                     \"r\"(mla::pack_bf16(upper[2 * pair], upper[2 * pair + 1])) : \"memory\");\n"
        "        asm volatile(\"st.shared.u32 [%0], %1;\" ::\"r\"(staging + latent_offset(64 + row, column)),\n"
        "                     \"r\"(mla::pack_bf16(lower[2 * pair], lower[2 * pair + 1])) : \"memory\");\n"
        "      });\n"
        "      asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n"
        "      asm volatile(\"bar.sync %0, 128;\" ::\"r\"(2 + consumer) : \"memory\");\n"
        "      if (threadIdx.x % 128 == 0) {\n"
        "        for (int half = 0; half < 2; ++half) {\n"
        "          asm volatile(\"cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\"\n"
        "                       ::\"l\"(reinterpret_cast<uint64_t>(&out_map)), \"r\"(tile * kColumns + half * kChunk),\n"
        "                       \"r\"(int(token0)), \"r\"(staging + half * kLatentChunkBytes) : \"memory\");\n"
        "        }\n"
        "        asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");\n"
        "        asm volatile(\"cp.async.bulk.wait_group.read 0;\" ::: \"memory\");\n"
        "        barrier_arrive(up_ring.empty_bar(last), kConsumerWarps);\n"
        "      }\n"
        "      continue;\n"
        "    }\n"),
    # and the threads that issued output stores see them complete before the block exits.
    "LAB_TMA_STORE_DRAINED": (
        "  if (threadIdx.x == 128) asm volatile(\"cp.async.bulk.wait_group.read 0;\" ::: \"memory\");\n",
        "  if (threadIdx.x % 128 == 0) asm volatile(\"cp.async.bulk.wait_group 0;\" ::: \"memory\");\n"),
}
SWITCHES.update(TMA_STORE_SWITCHES)
VARIANTS = {  # name -> switches; the names are those of kernels/NOTES.md's table
    "xchg": ("LAB_GEMM2_DRAIN", "LAB_LATE_TURN"),
    "xchg_w2": (),  # the committed kernel
    "xchg_w12": ("LAB_GEMM1_IN_FLIGHT",),
    "w12": ("LAB_GEMM1_IN_FLIGHT", "LAB_NO_EXCHANGE"),
    "stagger": tuple(STAGGER_SWITCHES),
    "stagger_up": ("LAB_STAGGER_UP_LOADS", "LAB_STAGGER_UP_MATH"),
    "timeline": tuple(TIMELINE_SWITCHES),
    "stages2": ("LAB_STAGES2",),
    "ring3": ("LAB_GEMM1_RING3",),
    "ring5": ("LAB_GEMM1_RING5",),
    "store_same": ("LAB_STORE_SAME",),
    "store_cs": ("LAB_STORE_CS",),
    "up_keep": ("LAB_UP_KEEP",),
    "hints": ("LAB_STORE_CS", "LAB_UP_KEEP"),
    "old_stores": ("LAB_OLD_STORES",),
    "old_scratch": ("LAB_OLD_SCRATCH",),
    "no_stg": ("LAB_NO_STG",),
    "store_na": ("LAB_STORE_NA",),
    "tma_store": tuple(TMA_STORE_SWITCHES),
    "arrive_early": ("LAB_EARLY_ARRIVE", "LAB_EARLY_ARRIVE_ONLY"),
    "no_fence": ("LAB_NO_FENCE",),
}
GARBAGE = {"store_same", "no_stg"}  # timed, never checked
EXTRA_SHAPES = (
    Shape(1, 513, 200, 512, 5, 64),
    Shape(1, 1000, 2048, 512, 1, 64),
    Shape(3, 333, 1000, 256, 3, 128),
    Shape(1, 16384, 64, 64, 1, 64),
    Shape(1, 257, 7168, 512, 16, 128),
    Shape(1, 384, 136, 120, 2, 96),
)
REAL_SHAPES = (V2_LITE, V2_LITE.with_tokens(1, 8192), V3_TP8, V3.with_tokens(1, 16384))
TIMED_SHAPES = {"toy": TOY, "v2l-512": V2_LITE.with_tokens(1, 512), "v2l-4096": V2_LITE,
                "v2l-8192": V2_LITE.with_tokens(1, 8192), "v3tp8-4096": V3_TP8, "v3-16384": V3.with_tokens(1, 16384)}


def lab_source() -> Path:
    text = (steps.KERNELS_DIR / "06_hopper.cu").read_text()
    for switch, (original, replacement) in SWITCHES.items():
        if text.count(original) != 1:
            raise RuntimeError(f"{switch}: kernels/06_hopper.cu no longer has exactly one {original!r}")
        text = text.replace(original, f"#ifdef {switch}\n{replacement}#else\n{original}#endif\n"
                            if original.endswith("\n") else
                            f"\n#ifdef {switch}\n{replacement}\n#else\n{original}\n#endif\n")
    return labkit.write_source(BUILD / "06_lab.cu", text)


def previous_source() -> Path:
    """kernels/06_hopper.cu as PREVIOUS_COMMIT had it."""
    return labkit.write_source(BUILD / "06_previous.cu", labkit.kernel_at(PREVIOUS_COMMIT, "kernels/06_hopper.cu"))


def switches_of(name: str) -> tuple[str, ...]:
    """A variant's switches; "a+b" is variants a and b together (e.g. timeline+no_stg)."""
    return tuple(dict.fromkeys(switch for part in name.split("+") for switch in VARIANTS[part]))


def kernel(name: str) -> steps.Kernel:
    if name == "previous":
        source, flags = previous_source(), ()
    else:
        source, flags = lab_source(), tuple(f"-D{switch}" for switch in switches_of(name))
    library = build.build_step(source, f"lab06_{name.replace('+', '_and_')}", steps.HOPPER_ARCH_FLAGS + flags)
    return steps.Kernel(steps.get(6), source, library)


def check_variant(name: str) -> bool:
    k, started = kernel(name), time.time()
    verdicts = check.check_matrix(k, "cuda", (*check.SHAPE_MATRIX, *EXTRA_SHAPES), (torch.bfloat16,), trials=3)
    verdicts += [check.check(k, s, torch.bfloat16, "cuda", trials=1) for s in REAL_SHAPES]
    print(f"{name}: {check.summary(verdicts)} ({time.time() - started:.0f} s)", flush=True)
    for verdict in verdicts:
        if not verdict.ok:
            print("   ", verdict)
    return all(v.ok for v in verdicts)


def time_variants(names: list[str]) -> None:
    built = {name: kernel(name) for name in names}
    for label, shape in TIMED_SHAPES.items():
        timings = bench.compare(built, shape, torch.bfloat16, seed=1, unchecked=GARBAGE)
        print(label.ljust(11) + "  ".join(f"{t.name} {t.median_us:.1f} ({t.low_us:.1f}-{t.high_us:.1f})"
                                          for t in timings), flush=True)


def timeline(variant: str = "") -> None:
    """The timeline variant's marks (of `variant` with the marks, if given), one call per real
    shape after about 0.3 s of the same calls (the clocks of a GPU kept busy): per-block phase
    lengths in clock64 cycles (median and max over the blocks), and the call's span by globaltimer."""
    k = kernel(f"timeline+{variant}" if variant else "timeline")
    library = ctypes.CDLL(str(k.library))
    marks = torch.empty((MARK_ROWS, len(MARK_COLUMNS)), dtype=torch.int64)
    for label in ("v2l-512", "v2l-4096", "v2l-8192", "v3tp8-4096", "v3-16384"):
        shape = TIMED_SHAPES[label]
        inputs = make_inputs(shape, torch.bfloat16, "cuda", 0)
        out = torch.empty(shape.out_shape, dtype=torch.bfloat16, device="cuda")
        started = time.time()
        while time.time() - started < 0.3:
            for _ in range(20):
                k(*inputs, shape.heads, out=out)
            torch.cuda.synchronize()
        if library.lab_clear_marks() != 0:
            raise RuntimeError("lab_clear_marks failed")
        k(*inputs, shape.heads, out=out)
        torch.cuda.synchronize()
        if library.lab_read_marks(ctypes.c_void_p(marks.data_ptr())) != 0:
            raise RuntimeError("lab_read_marks failed")
        m = {name: marks[marks[:, 0] != -1, i].double() for i, name in enumerate(MARK_COLUMNS)}
        end = torch.maximum(m["gemm2_done_0"], m["gemm2_done_1"])
        end_ns = torch.maximum(m["end_ns_0"], m["end_ns_1"])
        cycles_per_ns = ((end - m["start"]) / (end_ns - m["start_ns"])).median().item()
        phases = {
            "GEMM 1 (+ scratch writes)": m["gemm1_done"] - m["start"],
            "cluster barrier": m["cluster_barrier_met"] - m["gemm1_done"],
            "slice written and sent": m["slice_sent"] - m["cluster_barrier_met"],
            "cluster's slices received": m["cluster_slices_in"] - m["slice_sent"],
            "other groups' slices": m["latent_loaded"] - m["cluster_slices_in"],
            "GEMM 2, warpgroup 1": m["gemm2_done_0"] - m["latent_loaded"],
            "GEMM 2, warpgroup 2": m["gemm2_done_1"] - m["latent_loaded"],
            "block, start to end": end - m["start"],
        }
        if (m["writers_counted"] != -1).any():
            phases["producer: all writers counted"] = m["writers_counted"] - m["start"]
        span = (end_ns.max() - m["start_ns"].min()).item() / 1e3
        starts = (m["start_ns"].max() - m["start_ns"].min()).item() / 1e3
        print(f"{label}: {len(end)} blocks, call {span:.1f} µs (blocks start within {starts:.1f} µs), "
              f"{cycles_per_ns:.2f} cycles/ns; phases in µs, median / max over blocks:", flush=True)
        for name, cycles in phases.items():
            us = cycles / cycles_per_ns / 1e3
            print(f"    {name:32} {us.median().item():7.2f} / {us.max().item():7.2f}", flush=True)


def main(argv: list[str]) -> int:
    print(bench.device_line(), flush=True)
    if argv[0] == "check":
        return 0 if check_variant(argv[1]) else 1
    if argv[0] == "time":
        time_variants(argv[1:])
        return 0
    if argv[0] == "timeline":
        timeline(*argv[1:2])
        return 0
    shape = Shape(*map(int, argv[1:7]))
    verdict = check.check(kernel(argv[0]), shape, torch.bfloat16, "cuda", trials=1)
    print(argv[0], verdict)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
