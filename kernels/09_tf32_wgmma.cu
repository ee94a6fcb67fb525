// Step 9 — Hopper, fp32 inputs: two TF32 wgmma GEMMs, the weights transposed first, the latent
// through L2. Built with MLA_THREE_PASSES=1 it is step 10.
//
// What changed from steps 5 and 6, and why: step 5 runs fp32 on mma.sync at a quarter of cuBLAS's
// TF32 speed, and step 6's wgmma takes bf16 only.
// - wgmma reads TF32 operands K-major only: the weights are transposed and rounded to TF32 first,
//   once if the caller keeps them (mla_prepare), else on every call; TMA rounds hidden.
// - The fp32 latent tile (256 KB at 128 tokens) does not fit an SM, so it goes through L2.
// - Both GEMMs are one kernel, C = A @ B^T: a TMA producer and two consumer warpgroups; with too
//   few tiles to fill the GPU (few tokens) k is split over blocks and their sums added after.
// - A call is a chain of up to six kernels; each after the first is a programmatic dependent of
//   the one before, so its launch and set-up overlap that kernel's last blocks.
// Step 10: every operand split into TF32 hi and lo, each product as hi*hi + hi*lo + lo*hi, for
// fp32's accuracy; runs of chunks are added into registers, as the tensor cores round toward zero.
// Runs fp32 on sm_90 with d_model and rank multiples of 4, hidden 16-byte and out 8-byte aligned
// (mla_takes); the binding runs other inputs on step 5 (step 10: step 4).
// Measurements and the variants not kept: kernels/09_tf32_wgmma.md.
#include <stdint.h>

#include "mla_common.cuh"
#include "mla_hopper.cuh"

namespace {

using mla::barrier_arrive, mla::barrier_expect_bytes, mla::barrier_init, mla::barrier_wait, mla::fence_registers,
    mla::launch_dependents, mla::tma_load, mla::wait_for_previous_kernel, mla::wgmma_commit, mla::wgmma_fence,
    mla::wgmma_wait;

constexpr int kChunk = 32;     // K per stage: one 128-byte swizzled row of fp32
constexpr int kRowBytes = 128;
constexpr int kSharedBudget = 227 * 1024;
#ifndef MLA_THREE_PASSES
#define MLA_THREE_PASSES 0
#endif
constexpr bool kThreePasses = MLA_THREE_PASSES;
constexpr int kParts = kThreePasses ? 2 : 1;
// With three passes, how many chunks' sums the tensor cores carry before a consumer
// adds them into registers of its own (Tile::kPromoteChunks).
constexpr int kPromoteEvery = 4;

// A GEMM's block: kBlockM (128 or 64) x kBlockN results, two consumer warpgroups each computing
// 64 rows x kConsumerN of them (with 128 rows they split the rows, with 64 the columns), and as
// many stages as fit, at most kMostStages (fewer let two blocks share an SM, one storing its
// tile while the other computes). A stage holds each operand's kParts boxes: A's, then B's.
template <int kBlockM_, int kBlockN_, int kMostStages = 8>
struct Tile {
  static_assert(kBlockM_ == 128 || kBlockM_ == 64, "a consumer warpgroup computes 64 rows");
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr bool kSplitRows = kBlockM == 128;
  static constexpr int kConsumerN = kSplitRows ? kBlockN : kBlockN / 2;
  // The tensor cores round their running sums toward zero (kernels/09_tf32_wgmma.md): a bias
  // that grows with K and, once three passes remove the operands' rounding, is what is left. So
  // with three passes the tensor cores sum runs of kPromoteChunks chunks, and each run is added
  // into a second set of accumulators with FADD, which rounds to nearest; only where that second
  // set fits in registers (64 x 128 or fewer results per consumer).
  static constexpr int kPromoteChunks = kThreePasses && kConsumerN <= 128 ? kPromoteEvery : 0;
  static constexpr int kThreads = 3 * 128;  // a producer warpgroup, two consumers
  static constexpr int kAPartBytes = kBlockM * kRowBytes, kBPartBytes = kBlockN * kRowBytes;
  static constexpr int kABytes = kParts * kAPartBytes, kBBytes = kParts * kBPartBytes;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kFit = (kSharedBudget - 1024 - 2 * kMostStages * 8) / kStageBytes;
  static constexpr int kStages = kFit < kMostStages ? kFit : kMostStages;
  static constexpr int kSharedBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
};
using Gemm1Tile = Tile<128, 128>;  // V2-Lite 4096 tokens: 32 x 4 = 128 blocks
using Gemm2Tile = Tile<128, kThreePasses ? 128 : 256>;  // V2-Lite 4096 tokens: 512 blocks (1,024 with three passes)

// ---- wgmma ---------------------------------------------------------------------------------
// x rounded to the nearest TF32 value, as step 5 rounds its operands.
__device__ __forceinline__ float tf32(float x) { return __uint_as_float(mla::round_to_tf32(x)); }
// What x leaves after its TF32 part hi: exact in fp32, then rounded to TF32 itself.
__device__ __forceinline__ float tf32_rest(float x, float hi) { return tf32(x - hi); }
// Both operands are K-major, in 128-byte swizzled rows: groups of 8 rows 1024 bytes apart.
__device__ __forceinline__ uint64_t descriptor(uint32_t address) { return mla::descriptor(address, 16, 1024); }

// d += A (64 x 8, K-major) @ B (8 x 2N, K-major), both TF32 in shared memory: this thread's N
// accumulators of a 64 x 2N tile (N = 32, 64 or 128); d = A @ B when `accumulate` is false.
template <int N>
__device__ __forceinline__ void wgmma_tf32(float (&d)[N], uint64_t a, uint64_t b, bool accumulate = true) {
  static_assert(N == 32 || N == 64 || N == 128, "wgmma_tf32 has widths 64, 128 and 256");
  if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 " MLA_WGMMA_D32 ", %32, %33, accumulate, 1, 1;\n}\n"
        : MLA_WGMMA_ACC32(d, 0)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " MLA_WGMMA_D64 ", %64, %65, accumulate, 1, 1;\n}\n"
        : MLA_WGMMA_ACC64(d, 0)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  } else {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 " MLA_WGMMA_D128 ", %128, %129, accumulate, 1, 1;\n}\n"
        : MLA_WGMMA_ACC64(d, 0), MLA_WGMMA_ACC64(d, 64)
        : "l"(a), "l"(b), "r"(int(accumulate)));
  }
}

// How a GEMM stores C: as computed (the output), or as the next GEMM's A operand: rounded to
// TF32, or split into TF32 parts (hi into c, lo into c_lo).
enum class Store { kAsComputed, kTf32, kTf32Parts };

// Two adjacent results x, y of C at element `at`, stored as kStore says.
template <Store kStore>
__device__ __forceinline__ void store_pair(float* c, float* c_lo, int64_t at, float x, float y) {
  if constexpr (kStore == Store::kAsComputed) {
    mla::store_whole<mla::Space::kGlobal>(c + at, make_uint2(__float_as_uint(x), __float_as_uint(y)));
  } else {
    const float x_hi = tf32(x), y_hi = tf32(y);
    mla::store_whole<mla::Space::kGlobal>(c + at, make_uint2(__float_as_uint(x_hi), __float_as_uint(y_hi)));
    if constexpr (kStore == Store::kTf32Parts) {
      mla::store_whole<mla::Space::kGlobal>(
          c_lo + at, make_uint2(__float_as_uint(tf32_rest(x, x_hi)), __float_as_uint(tf32_rest(y, y_hi))));
    }
  }
}

// Block order. About 132 blocks run at a time, in the order of blockIdx.x. Row tile by row tile,
// each wave of GEMM 2 would read all of B: at V3 [w_up_k | w_up_v]^T is 64 MB in fp32, more than
// the 50 MB L2, so it came from DRAM again for every 128 tokens. Blocks go instead in groups of
// kGroupRows row tiles, column tile by column tile within a group: a group reads B once, and its
// rows of A (at most 2,048 x rank) stay in L2 while it does.
constexpr int64_t kGroupRows = 16;
__device__ __forceinline__ void tile_of_block(int64_t tiles_m, int64_t tiles_n, int64_t& tile_m, int64_t& tile_n) {
  const int64_t per_group = kGroupRows * tiles_n, group = blockIdx.x / per_group, in_group = blockIdx.x % per_group;
  const int64_t first = group * kGroupRows, rows = min(kGroupRows, tiles_m - first);
  tile_m = first + in_group % rows;
  tile_n = in_group / rows;
}

// C (m x n, rows `pitch` apart) = A (m x k) @ B (n x k)^T, TF32 products summed in fp32. With
// kParts == 2 each operand comes as hi and lo parts (a_map and a_lo_map, b_map and b_lo_map), and
// each product is three passes. With gridDim.y > 1 the chunks of k are split over blocks: block
// row y sums its share of them into its own m x n slice of c, y * m * pitch elements in.
template <class T, Store kStore>
__global__ void __launch_bounds__(T::kThreads, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap a_lo_map,
                const __grid_constant__ CUtensorMap b_map, const __grid_constant__ CUtensorMap b_lo_map,
                float* __restrict__ c, float* __restrict__ c_lo, int64_t m, int64_t n, int64_t k, int64_t pitch) {
  extern __shared__ uint8_t shared_raw[];
  // The swizzle is a function of address bits 4-9: every operand box starts 1024-aligned.
  const uint32_t base = (mla::shared_address(shared_raw) + 1023) & ~1023u;
  const uint32_t full = base + T::kStages * T::kStageBytes, empty = full + 8 * T::kStages;
  auto a_at = [&](int slot) { return base + uint32_t(slot) * T::kStageBytes; };
  auto b_at = [&](int slot) { return a_at(slot) + T::kABytes; };
  int64_t tile_m, tile_n;
  tile_of_block(mla::ceil_div(m, T::kBlockM), mla::ceil_div(n, T::kBlockN), tile_m, tile_n);
  const int64_t m0 = tile_m * T::kBlockM, n0 = tile_n * T::kBlockN;
  const int per_split = int(mla::ceil_div(mla::ceil_div(k, kChunk), gridDim.y));
  const int first = int(blockIdx.y) * per_split;
  const int chunks = max(0, min(per_split, int(mla::ceil_div(k, kChunk)) - first));
  c += int64_t(blockIdx.y) * m * pitch;

  if (threadIdx.x == 0) {
    for (int slot = 0; slot < T::kStages; ++slot) {
      barrier_init(full + 8 * slot, 1);
      barrier_init(empty + 8 * slot, 8);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // As in every kernel of the chain: let the next one start, and wait, in all threads, for the one
  // before to finish before any global access (a block may have no chunks and store at once, and
  // what it writes the kernel before may still read).
  launch_dependents();
  wait_for_previous_kernel();

  if (threadIdx.x < 128) {  // the producer: one thread issues every copy
    if (threadIdx.x == 0) {
      for (int chunk = 0; chunk < chunks; ++chunk) {
        const int slot = chunk % T::kStages, along_k = (first + chunk) * kChunk;
        // A fresh barrier counts as having completed the phase before its first, so the first
        // round of slots does not wait.
        barrier_wait(empty + 8 * slot, (chunk / T::kStages & 1) ^ 1);
        barrier_expect_bytes(full + 8 * slot, T::kStageBytes);  // boxes past an edge land zeros
        tma_load(a_at(slot), a_map, along_k, int(m0), full + 8 * slot);
        tma_load(b_at(slot), b_map, along_k, int(n0), full + 8 * slot);
        if constexpr (kParts == 2) {
          tma_load(a_at(slot) + T::kAPartBytes, a_lo_map, along_k, int(m0), full + 8 * slot);
          tma_load(b_at(slot) + T::kBPartBytes, b_lo_map, along_k, int(n0), full + 8 * slot);
        }
      }
    }
    return;
  }

  // Consumer warpgroups: 64 rows x kConsumerN columns of the block's tile each. The next
  // stage's wgmmas are issued before waiting for this one's, so the tensor cores never drain
  // between stages, and stages go back to the producer one behind.
  const int consumer = threadIdx.x / 128 - 1;
  const bool warp_leader = threadIdx.x % 32 == 0;
  const int row0 = T::kSplitRows ? 64 * consumer : 0, column0 = T::kSplitRows ? 0 : T::kConsumerN * consumer;
  constexpr int kRun = T::kPromoteChunks;
  float acc[T::kConsumerN / 2];
  float total[kRun != 0 ? T::kConsumerN / 2 : 1];  // with runs: the sum of the runs before this one
#pragma unroll
  for (int i = 0; i < T::kConsumerN / 2; ++i) acc[i] = 0.0f;
  if constexpr (kRun != 0) {
#pragma unroll
    for (int i = 0; i < T::kConsumerN / 2; ++i) total[i] = 0.0f;
  }
  fence_registers(acc);
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int slot = chunk % T::kStages;
    bool run_starts = false, run_ends = false;
    if constexpr (kRun != 0) run_starts = chunk % kRun == 0, run_ends = chunk % kRun == kRun - 1 || chunk == chunks - 1;
    barrier_wait(full + 8 * slot, chunk / T::kStages & 1);
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < kChunk / 8; ++step) {  // 8 fp32 deep: 32 bytes along the row
      const uint32_t a = a_at(slot) + row0 * kRowBytes + 32 * step, b = b_at(slot) + column0 * kRowBytes + 32 * step;
      const bool overwrite = run_starts && step == 0;  // a run's first wgmma starts acc afresh
      if constexpr (kParts == 2) {  // the small terms first
        wgmma_tf32(acc, descriptor(a + T::kAPartBytes), descriptor(b), !overwrite);
        wgmma_tf32(acc, descriptor(a), descriptor(b + T::kBPartBytes));
        wgmma_tf32(acc, descriptor(a), descriptor(b));
      } else {
        wgmma_tf32(acc, descriptor(a), descriptor(b), !overwrite);
      }
    }
    wgmma_commit();
    if (run_ends) {  // the tensor cores drain here, once a run
      wgmma_wait<0>();
      fence_registers(acc);
      if constexpr (kRun != 0) {
#pragma unroll
        for (int i = 0; i < T::kConsumerN / 2; ++i) total[i] += acc[i];
      }
    } else {
      wgmma_wait<1>();
    }
    if (chunk > 0 && warp_leader) barrier_arrive(empty + 8 * ((chunk - 1) % T::kStages), 1);
  }
  wgmma_wait<0>();
  fence_registers(acc);
  if constexpr (kRun != 0) {
#pragma unroll
    for (int i = 0; i < T::kConsumerN / 2; ++i) acc[i] = total[i];
  }

  // wgmma's accumulator layout: this thread holds rows warp * 16 + lane / 4 (and + 8), columns
  // 8 * i + 2 * (lane % 4) and + 1. n is even (rank, and 2 * width), so a pair never straddles it.
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int64_t row = m0 + row0 + warp * 16 + lane / 4;
#pragma unroll
  for (int i = 0; i < T::kConsumerN / 8; ++i) {
    const int64_t column = n0 + column0 + 8 * i + 2 * (lane % 4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (row + 8 * half < m && column < n) {
        store_pair<kStore>(c, c_lo, (row + 8 * half) * pitch + column, acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
      }
    }
  }
}

// to[c][r] = from[r][c] rounded to TF32 (and with kParts == 2 to_lo[c][r] = what that leaves, as
// TF32), for three matrices at once. A block moves one square; blocks go matrix by matrix, and
// square row by square row within one. (A grid covering the largest of the three in x, y and z
// left 94 % of its blocks with nothing to do at V3, and took 290 µs.)
struct Transpose {
  const float* from;
  float* to;
  float* to_lo;
  int64_t rows, columns, to_pitch;  // `from` is dense: rows `columns` apart
  int64_t first_square;  // the block that moves this matrix's first square
};
struct Transposes {
  Transpose job[3];
};
constexpr int kSide = 32;  // a block moves a 32 x 32 square through shared memory

__global__ void __launch_bounds__(kSide * 8) transpose_kernel(const __grid_constant__ Transposes transposes) {
  __shared__ float square[kSide][kSide + 1];  // + 1: a column's 32 values on 32 banks
  launch_dependents();
  wait_for_previous_kernel();
  const int job = blockIdx.x >= transposes.job[2].first_square ? 2 : blockIdx.x >= transposes.job[1].first_square;
  const Transpose& t = transposes.job[job];
  const int64_t mine = blockIdx.x - t.first_square, across = mla::ceil_div(t.columns, kSide);
  const int64_t r0 = mine / across * kSide, c0 = mine % across * kSide;
  for (int i = threadIdx.y; i < kSide; i += 8) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < t.rows && c < t.columns) square[i][threadIdx.x] = t.from[r * t.columns + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kSide; i += 8) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (c < t.columns && r < t.rows) {
      const float x = square[threadIdx.x][i], hi = tf32(x);
      t.to[c * t.to_pitch + r] = hi;
      if constexpr (kParts == 2) t.to_lo[c * t.to_pitch + r] = tf32_rest(x, hi);
    }
  }
}

// hidden's TF32 parts for three passes: hi = x rounded, lo = what that leaves, rounded; 4 values a
// thread (tokens * d_model is a multiple of 4, hidden 16-byte aligned).
__global__ void split_kernel(const float4* __restrict__ x, float* __restrict__ hi, float* __restrict__ lo,
                             int64_t quads) {
  launch_dependents();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < quads; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    const float h[4] = {tf32(v.x), tf32(v.y), tf32(v.z), tf32(v.w)};
    mla::store_whole<mla::Space::kGlobal>(hi + 4 * i, make_uint4(__float_as_uint(h[0]), __float_as_uint(h[1]),
                                                                 __float_as_uint(h[2]), __float_as_uint(h[3])));
    mla::store_whole<mla::Space::kGlobal>(
        lo + 4 * i, make_uint4(__float_as_uint(tf32_rest(v.x, h[0])), __float_as_uint(tf32_rest(v.y, h[1])),
                               __float_as_uint(tf32_rest(v.z, h[2])), __float_as_uint(tf32_rest(v.w, h[3]))));
  }
}

// C (`pairs` pairs of elements, dense) = the sum of the `splits` slices of `partials` that a GEMM
// split along k wrote, stored as kStore says.
template <Store kStore>
__global__ void sum_splits_kernel(const float2* __restrict__ partials, int splits, int64_t pairs, float* c,
                                  float* c_lo) {
  launch_dependents();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    float2 sum = partials[i];
    for (int split = 1; split < splits; ++split) {
      const float2 part = partials[split * pairs + i];
      sum.x += part.x;
      sum.y += part.y;
    }
    store_pair<kStore>(c, c_lo, 2 * i, sum.x, sum.y);
  }
}

// ---- host side -----------------------------------------------------------------------------
// A row-major fp32 matrix (rows x columns) read in swizzled boxes of box_rows x 32.
bool make_map(CUtensorMap* map, const float* data, int64_t rows, int64_t columns, int box_rows) {
  return mla::make_swizzled_map(map, data, CU_TENSOR_MAP_DATA_TYPE_TFLOAT32, 4, rows, columns, box_rows);
}

// An operand in TF32 parts: `hi`, and with kParts == 2 `lo` (else unused).
struct Parts {
  const float* hi;
  const float* lo;
};

// Few tiles leave most SMs idle while each block streams all of k: at V3-TP8 and one decode token
// GEMM 1 has 4 tiles of 128 x 7,168 weights each, on 4 of 132 SMs. Where the tiles fill under a
// quarter of the SMs, k is split over blocks until they fill them, at least kLeastSplitChunks
// chunks each; the partial sums go through the workspace and a second kernel adds them.
constexpr int kLeastSplitChunks = 4;
template <class T>
int splits_of(int64_t m, int64_t n, int64_t k) {
  const int64_t tiles = mla::ceil_div(m, T::kBlockM) * mla::ceil_div(n, T::kBlockN), chunks = mla::ceil_div(k, kChunk);
  const int64_t fill = mla::multiprocessor_count() / tiles, most = chunks / kLeastSplitChunks;
  if (fill < 4 || most < 2) return 1;
  const int64_t per_split = mla::ceil_div(chunks, fill < most ? fill : most);
  return int(mla::ceil_div(chunks, per_split));  // every split gets chunks
}
template <class T>
int64_t partial_elements(int64_t m, int64_t n, int64_t k) {
  const int splits = splits_of<T>(m, n, k);
  return splits > 1 ? splits * m * n : 0;
}

template <class T, Store kStore>
cudaError_t gemm(Parts a, Parts b, float* c, float* c_lo, int64_t m, int64_t n, int64_t k, float* partials,
                 bool after_kernel, cudaStream_t stream) {
  CUtensorMap maps[4];  // a, a_lo, b, b_lo
  const float* data[4] = {a.hi, kParts == 2 ? a.lo : a.hi, b.hi, kParts == 2 ? b.lo : b.hi};
  for (int i = 0; i < 4; ++i) {
    if (!make_map(&maps[i], data[i], i < 2 ? m : n, k, i < 2 ? T::kBlockM : T::kBlockN)) return cudaErrorInvalidValue;
  }
  const int splits = splits_of<T>(m, n, k);
  const auto kernel = splits > 1 ? gemm_kernel<T, Store::kAsComputed> : gemm_kernel<T, kStore>;
  cudaError_t err = mla::allow_shared_memory(kernel, T::kSharedBytes);
  if (err != cudaSuccess) return err;
  const dim3 blocks(unsigned(mla::ceil_div(m, T::kBlockM) * mla::ceil_div(n, T::kBlockN)), unsigned(splits));
  err = mla::launch(after_kernel, mla::kNoClusters, kernel, blocks, dim3(T::kThreads), T::kSharedBytes, stream,
                    maps[0], maps[1], maps[2], maps[3], splits > 1 ? partials : c, c_lo, m, n, k, n);
  if (splits == 1 || err != cudaSuccess) return err;
  const int64_t pairs = m * n / 2, sum_blocks = mla::ceil_div(pairs, 256), most = 132 * 8;  // then grid-stride
  return mla::launch(true, mla::kNoClusters, sum_splits_kernel<kStore>,
                     dim3(unsigned(sum_blocks < most ? sum_blocks : most)), dim3(256), 0, stream,
                     reinterpret_cast<const float2*>(partials), splits, pairs, c, c_lo);
}

// fp32 arrays one after the other, each 256-byte aligned and in parts[i] parts (hi, then lo).
template <int N>
struct Arrays {
  int64_t offset[N], part_bytes[N], bytes = 0;
  Arrays(const int64_t (&elements)[N], const int (&parts)[N]) {
    for (int i = 0; i < N; ++i) {
      offset[i] = bytes;
      part_bytes[i] = mla::round_up(elements[i] * 4, 256);
      bytes += parts[i] * part_bytes[i];
    }
  }
  Parts at(const void* base, int i) const {
    const auto* start = static_cast<const uint8_t*>(base) + offset[i];
    return {reinterpret_cast<const float*>(start), reinterpret_cast<const float*>(start + part_bytes[i])};
  }
  float* part(void* base, int i, int which) const {  // which: 0 hi, 1 lo
    return reinterpret_cast<float*>(static_cast<uint8_t*>(base) + offset[i] + which * part_bytes[i]);
  }
};
// The weights as the GEMMs read them, transposed and rounded to TF32: w_down^T (rank x d_model),
// then [w_up_k | w_up_v]^T (2 * width x rank). They depend on the weights only, so mla_prepare
// writes them once where the caller keeps them; without that, every call writes them into its
// workspace first.
Arrays<2> weights_of(const MlaProblem* p) {
  return Arrays<2>({p->rank * p->d_model, 2 * p->heads * p->head_dim * p->rank}, {kParts, kParts});
}
// What each call writes: the latent (tokens x rank), with three passes hidden's parts, and the
// partial sums of a GEMM split along k (splits_of), one of the two at a time.
Arrays<3> per_call_of(const MlaProblem* p) {
  const int64_t width = p->heads * p->head_dim;
  const int64_t gemm1 = partial_elements<Gemm1Tile>(p->tokens, p->rank, p->d_model);
  const int64_t gemm2 = partial_elements<Gemm2Tile>(p->tokens, 2 * width, p->rank);
  return Arrays<3>({p->tokens * p->rank, kParts == 2 ? p->tokens * p->d_model : 0, gemm1 > gemm2 ? gemm1 : gemm2},
                   {kParts, kParts, 1});
}
int64_t workspace_bytes(const MlaProblem* p) {
  return per_call_of(p).bytes + (p->prepared != nullptr ? 0 : weights_of(p).bytes);
}

// The weights' part of mla_takes: what mla_prepare needs.
bool takes_weights(const MlaProblem* p) {
  return mla::on_hopper() && p->dtype == MLA_FLOAT32 && p->d_model % 4 == 0 && p->rank % 4 == 0 &&
         mla::encode_function() != nullptr;
}

bool takes(const MlaProblem* p) {
  return takes_weights(p) && reinterpret_cast<uintptr_t>(p->hidden) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p->out) % 8 == 0;
}

// Writes weights_of(p) into `to`: each weight transposed and rounded (split) to TF32.
cudaError_t prepare(const MlaProblem* p, void* to, cudaStream_t stream) {
  const Arrays<2> weights = weights_of(p);
  const int64_t width = p->heads * p->head_dim, v_at = width * p->rank;  // w_up_v's rows after w_up_k's
  float *down_t = weights.part(to, 0, 0), *down_t_lo = weights.part(to, 0, 1);
  float *up_t = weights.part(to, 1, 0), *up_t_lo = weights.part(to, 1, 1);
  Transposes transposes{{{static_cast<const float*>(p->w_down), down_t, down_t_lo, p->d_model, p->rank, p->d_model},
                         {static_cast<const float*>(p->w_up_k), up_t, up_t_lo, p->rank, width, p->rank},
                         {static_cast<const float*>(p->w_up_v), up_t + v_at, up_t_lo + v_at, p->rank, width, p->rank}}};
  int64_t squares = 0;
  for (Transpose& t : transposes.job) {
    t.first_square = squares;
    squares += mla::ceil_div(t.rows, kSide) * mla::ceil_div(t.columns, kSide);
  }
  return mla::launch(false, mla::kNoClusters, transpose_kernel, dim3(unsigned(squares)), dim3(kSide, 8), 0, stream,
                     transposes);
}

}  // namespace

extern "C" int mla_takes(const MlaProblem* p) { return takes(p); }

extern "C" size_t mla_workspace_bytes(const MlaProblem* p) { return takes(p) ? size_t(workspace_bytes(p)) : 0; }

extern "C" size_t mla_prepared_bytes(const MlaProblem* p) { return takes_weights(p) ? size_t(weights_of(p).bytes) : 0; }

extern "C" cudaError_t mla_prepare(const MlaProblem* p, void* prepared, cudaStream_t stream) {
  if (!takes_weights(p) || prepared == nullptr) return cudaErrorNotSupported;
  return prepare(p, prepared, stream);
}

extern "C" cudaError_t mla_launch(const MlaProblem* p, cudaStream_t stream) {
  if (!takes(p) || p->workspace == nullptr) return cudaErrorNotSupported;
  const int64_t width = p->heads * p->head_dim;
  const Arrays<2> weights = weights_of(p);
  const Arrays<3> per_call = per_call_of(p);
  const void* prepared = p->prepared;
  void* scratch = p->workspace;
  cudaError_t err;
  bool after_kernel = false;  // the call's first kernel waits for whatever ran before it
  if (prepared == nullptr) {  // the weights' layout first, in the workspace, then the rest after it
    if ((err = prepare(p, p->workspace, stream)) != cudaSuccess) return err;
    prepared = p->workspace;
    after_kernel = true;
    scratch = static_cast<uint8_t*>(p->workspace) + weights.bytes;
  }
  const auto* hidden = static_cast<const float*>(p->hidden);
  // With one pass hidden reaches the tensor cores as it is; with three, as its parts.
  Parts hidden_parts{hidden, nullptr};
  if (kParts == 2) {
    float *hidden_hi = per_call.part(scratch, 1, 0), *hidden_lo = per_call.part(scratch, 1, 1);
    hidden_parts = {hidden_hi, hidden_lo};
    const int64_t quads = p->tokens * p->d_model / 4;
    const int64_t blocks = mla::ceil_div(quads, 256), most = 132 * 16;  // then grid-stride
    err = mla::launch(after_kernel, mla::kNoClusters, split_kernel, dim3(unsigned(blocks < most ? blocks : most)),
                      dim3(256), 0, stream, reinterpret_cast<const float4*>(hidden), hidden_hi, hidden_lo, quads);
    if (err != cudaSuccess) return err;
    after_kernel = true;
  }
  float *latent = per_call.part(scratch, 0, 0), *latent_lo = per_call.part(scratch, 0, 1);
  float* partials = per_call.part(scratch, 2, 0);
  constexpr Store kLatentStore = kParts == 2 ? Store::kTf32Parts : Store::kTf32;
  if ((err = gemm<Gemm1Tile, kLatentStore>(hidden_parts, weights.at(prepared, 0), latent, latent_lo, p->tokens,
                                           p->rank, p->d_model, partials, after_kernel, stream)) != cudaSuccess) {
    return err;
  }
  return gemm<Gemm2Tile, Store::kAsComputed>({latent, latent_lo}, weights.at(prepared, 1), static_cast<float*>(p->out),
                                             nullptr, p->tokens, 2 * width, p->rank, partials, true, stream);
}
