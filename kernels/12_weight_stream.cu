// Step 12 — one to sixteen tokens (bf16: to 512, fp32: to 64): every SM streams its share of the weights into its math.
//
// What changed from step 11, and why: with a handful of tokens the projection is a matrix-vector
// product, each weight used once per token, and the weights are almost every byte (6.3 MB at
// V2-Lite in bf16). Step 11 still runs it as a tiled GEMM: a block stages its weight tile in
// shared memory, streams 16-row token tiles through a ring and waits on tensor-core chains and a
// cluster barrier per tile, which took 9.6 µs at one token against a floor of about 2.
// - No weight tiles, no ring: each thread loads a few weight rows of its columns straight into
//   registers and multiplies them by the tokens' values, which the block staged in shared memory
//   once. Two batches of rows are in flight at a time, the first two before the kernel reads
//   anything it depends on.
// - From two tokens, bf16 multiplies on the tensor cores (mma.sync, the tokens as A's 16 rows,
//   padded): the registers two weight rows land in are B's fragment once the rows are
//   interleaved, and a thread's sums take 16 registers for any token count, where FFMA's take 8 a
//   token. fp32 (at fp32's accuracy) and bf16's single token stay on FFMA, 8 columns a thread.
// - A block owns 32 columns and splits its depth over its threads, whose sums are added in shared
//   memory. GEMM 1 (depth d_model) also splits d_model over a cluster of up to 8 blocks, added
//   through distributed shared memory, into a scratch buffer: in bf16 wherever GEMM 2 runs on the
//   tensor cores (it rounds its operands to bf16 anyway, and each of its blocks reads the whole
//   latent, so bf16 halves that traffic), in fp32 otherwise.
// - GEMM 2 is launched as a programmatic dependent: its blocks load their first weight rows while
//   GEMM 1 runs and wait (griddepcontrol.wait) only before they read the latent.
// - In bf16, where the outputs come in 64-column tiles, GEMM 2 runs on wgmma with its
//   operands swapped: a block's 64 weight columns are A (TMA copies them, MN-major, into shared
//   memory, all of the rank at once, before the wait), the latent's token rows are B (N = 16), and
//   one warpgroup multiplies them with no register staging and few instructions per weight.
// - Past 16 bf16 tokens GEMM 1 swaps its operands onto wgmma too: 64 columns of w_down are A, a
//   64-token tile of hidden is B, d_model is split over a cluster of up to 8 blocks that stream
//   their boxes through a 4-stage TMA ring, and the parts are added through distributed shared
//   memory into a bf16 latent; GEMM 2 takes a grid row per token tile, 64 tokens (128 past 128
//   tokens, so that 256 tokens run in one wave and each block loads its weights once for twice the
//   tokens; 512 in two).
// - From 17 to 64 fp32 tokens both GEMMs run as a tile of 64 tokens on mma.sync, three TF32
//   passes a product: the weights are mma's B as they lie in memory (wgmma would want them transposed),
//   staged with the tokens through a ring of cp.async copies, the depth split over a cluster.
// Runs on sm_90a with 1 to 16 tokens, rank and heads * head_dim multiples of 8, 16-byte aligned
// weights and a token slice that fits shared memory; in bf16 with 17 to 512 tokens where rank
// <= 512, heads * head_dim is a multiple of 64, d_model a multiple of 8 and hidden 16-byte aligned;
// in fp32 with 17 to 64 tokens where rank and heads * head_dim are multiples of 8 and the weights
// 16-byte aligned (mla_takes). The binding runs the others on step 4. Notes:
// kernels/12_weight_stream.md.

#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include <cooperative_groups.h>

#include "mla_common.cuh"
#include "mla_hopper.cuh"

namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kColumns = 32;               // columns of a block
constexpr int kMaxSplits = 8;              // the portable cluster size
constexpr int kMaxTokens = 16;
constexpr int kSharedBudget = 227 * 1024;  // an sm_90 block's opt-in shared memory
// A token's sums in shared memory, one row of a block's columns; the padding word puts the
// tensor-core lanes that store one column for 8 tokens in 8 different banks.
constexpr int kSumPitch = kColumns + 1;

// Weights are read once per call, so their loads bypass L1.
__device__ __forceinline__ uint4 load_streaming_16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 load_streaming_8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// ---- FFMA, 8 columns a thread: fp32, and bf16's single token --------------------------------------
constexpr int kColumnGroups = kColumns / 8;             // threads that share a weight row
constexpr int kDepthGroups = kThreads / kColumnGroups;  // threads that split a block's depth
static_assert(kColumnGroups == 4, "the shuffles' lane bits 4, 8 and 16 are a warp's depth groups");

// Eight consecutive weights of one row, as loaded: one 16-byte load in bf16, two in fp32.
template <typename T>
struct EightWeights;

template <>
struct EightWeights<bf16> {
  uint4 bits;
  __device__ __forceinline__ void load(const bf16* p) { bits = load_streaming_16(p); }
  __device__ __forceinline__ void clear() { bits = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void unpack(float (&w)[8]) const {
    const uint32_t pairs[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // a bf16 is the upper half of the float it widens to
      w[2 * i] = __uint_as_float(pairs[i] << 16);
      w[2 * i + 1] = __uint_as_float(pairs[i] & 0xFFFF0000u);
    }
  }
};

template <>
struct EightWeights<float> {
  uint4 first, second;
  __device__ __forceinline__ void load(const float* p) { first = load_streaming_16(p), second = load_streaming_16(p + 4); }
  __device__ __forceinline__ void clear() { first = second = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void unpack(float (&w)[8]) const {
    const uint32_t bits[8] = {first.x, first.y, first.z, first.w, second.x, second.y, second.z, second.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __uint_as_float(bits[i]);
  }
};

// Rows of weights in one batch of a thread's loads: 128 bytes, in bf16 and fp32 alike.
template <typename T>
constexpr int kBatch = 128 / int(sizeof(EightWeights<T>));

// ---- bf16 from 2 tokens: mma.sync m16n8k16, the tokens as A's 16 rows -------------------------------
// A lane's B fragment is 4 rows of one column (rows 2q, 2q + 1, 2q + 8 and 2q + 9 of a 16-row
// chunk, q = lane % 4). Loading 4 columns of each of those rows (8 bytes) gives the fragments of 4
// mma at once, one per column, after the two rows of each pair are interleaved; a warp's 8 lane
// groups (lane / 4) cover the block's 32 columns.
constexpr int kChunkRows = 16;  // an mma's depth
constexpr int kChunks = 4;      // chunks a warp loads per batch: 16 loads of 8 bytes, 128 bytes a lane
constexpr int kMmaTokens = 16;  // A's rows; the rows past the call's tokens are zeros
static_assert(kMaxTokens <= kMmaTokens, "every token the step takes is a row of A");

enum class Math { kFfma, kMma };
// bf16 from 2 tokens up goes to the tensor cores. One token stays on FFMA, which was measured
// faster there (kernels/12_weight_stream.md); why is not yet known.
template <typename T>
constexpr Math math_for(int64_t tokens) {
  return std::is_same_v<T, bf16> && tokens > 1 ? Math::kMma : Math::kFfma;
}
// A block's rows per batch. Two batches are in flight at a time.
template <typename T, Math kMath>
constexpr int kBatchRows = kMath == Math::kMma ? kWarps * kChunks * kChunkRows : kDepthGroups * kBatch<T>;

// One GEMM of the projection, C = A @ W, for a few rows of A: the tokens of hidden and w_down
// (GEMM 1, C the fp32 latent), or the latent and [w_up_k | w_up_v] (GEMM 2, C the stacked output).
template <typename T, typename In, typename Out>
struct Pass {
  using Output = Out;
  const In* rows;
  int64_t row_pitch;
  mla::WeightColumns<T> weights;
  Out* out;
  int64_t out_pitch;
  int tokens, depth, columns;
  int part_depth;      // depth per block of a cluster
  bool after_primary;  // launched as a programmatic dependent of the previous kernel
};

// A block's depth is staged rounded up to whole batches, so every thread runs the same loop.
template <typename T, Math kMath>
__host__ __device__ constexpr int staged_depth(int part_depth) {
  return int(mla::round_up(part_depth, kBatchRows<T, kMath>));
}
// bf16's staged tokens: 16 rows of bf16 pairs; 4 words of padding put the 8 tokens an A fragment
// reads in different banks.
__host__ __device__ constexpr int pair_pitch(int staged) { return staged / 2 + 4; }
// Shared memory after the staged tokens: each warp's sums, then the block's that the cluster adds.
constexpr int sums_bytes(int tokens) { return (kWarps * tokens * kSumPitch + tokens * kColumns) * 4; }

// The block's warps' sums (warp_sums[warp][token][column], kSumPitch a token) added, then the
// cluster's blocks' sums through distributed shared memory; each block adds and stores every
// splits-th of them.
template <int kTokens, typename P>
__device__ __forceinline__ void add_and_store(const P& p, const float* warp_sums, float* block_sums) {
  const cg::cluster_group cluster = cg::this_cluster();
  const int splits = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  __syncthreads();
  for (int i = threadIdx.x; i < kTokens * kColumns; i += kThreads) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[(w * kTokens + i / kColumns) * kSumPitch + i % kColumns];
    block_sums[i] = total;
  }
  cluster.sync();
  for (int i = threadIdx.x * splits + rank; i < kTokens * kColumns; i += kThreads * splits) {
    const int token = i / kColumns, out_column = int(blockIdx.x) * kColumns + i % kColumns;
    if (token >= p.tokens || out_column >= p.columns) continue;
    float total = 0.0f;
    for (int r = 0; r < splits; ++r) total += cluster.map_shared_rank(block_sums, r)[i];
    p.out[int64_t(token) * p.out_pitch + out_column] = mla::from_float<typename P::Output>(total);
  }
  // No block may leave while another still reads its sums.
  cluster.sync();
}

template <typename T, typename In, typename Out, int kTokens>
__global__ void __launch_bounds__(kThreads) stream_weights_ffma(const Pass<T, In, Out> p) {
  constexpr int kRows = kBatchRows<T, Math::kFfma>;
  extern __shared__ float4 shared_words[];
  float* const values = reinterpret_cast<float*>(shared_words);  // [staged depth][kTokens]
  const int staged = staged_depth<T, Math::kFfma>(p.part_depth);
  float* const warp_sums = values + staged * kTokens;
  float* const block_sums = warp_sums + kWarps * kTokens * kSumPitch;

  const int rank = int(cg::this_cluster().block_rank());
  const int depth0 = rank * p.part_depth, depth_end = min(p.depth, depth0 + p.part_depth);
  const int column_group = threadIdx.x % kColumnGroups, depth_group = threadIdx.x / kColumnGroups;
  const int column = int(blockIdx.x) * kColumns + column_group * 8;
  const bool inside = column < p.columns;  // columns come in whole groups of 8
  const T* const column_top = p.weights.at(0, inside ? column : 0);  // a group's columns lie in one matrix
  mla::launch_dependents();

  EightWeights<T> now[kBatch<T>], next[kBatch<T>];
  const auto fetch = [&](EightWeights<T>(&batch)[kBatch<T>], int first) {
#pragma unroll
    for (int i = 0; i < kBatch<T>; ++i) {
      const int row = depth0 + first + i * kDepthGroups + depth_group;
      if (inside && row < depth_end) {
        batch[i].load(column_top + int64_t(row) * p.weights.ld);
      } else {
        batch[i].clear();
      }
    }
  };
  // Two batches in flight before the wait: the weights do not depend on the kernel before.
  fetch(now, 0);
  if (kRows < staged) fetch(next, kRows);

  // GEMM 2's rows are GEMM 1's output: read them only once GEMM 1 has finished and flushed.
  if (p.after_primary) mla::wait_for_previous_kernel();
  // Every token's value of a depth in flight at once (staged is a multiple of kThreads).
#pragma unroll 4
  for (int k = threadIdx.x; k < staged; k += kThreads) {
    float x[kTokens];
#pragma unroll
    for (int token = 0; token < kTokens; ++token) {
      x[token] = token < p.tokens && depth0 + k < depth_end
                     ? mla::to_float(p.rows[int64_t(token) * p.row_pitch + depth0 + k])
                     : 0.0f;
    }
#pragma unroll
    for (int token = 0; token < kTokens; ++token) values[k * kTokens + token] = x[token];
  }
  __syncthreads();

  float sum[kTokens][8] = {};
  for (int first = 0; first < staged; first += kRows) {
#pragma unroll
    for (int i = 0; i < kBatch<T>; ++i) {
      float w[8];
      now[i].unpack(w);
      const float* x = values + (first + i * kDepthGroups + depth_group) * kTokens;
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
#pragma unroll
        for (int j = 0; j < 8; ++j) sum[t][j] = fmaf(x[t], w[j], sum[t][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch<T>; ++i) now[i] = next[i];
    if (first + 2 * kRows < staged) fetch(next, first + 2 * kRows);
  }

  // A warp's lanes are 8 depth groups times the 4 column groups: add over the depth groups. Each
  // round halves what a lane holds: it sends its partner the half of its columns that the partner
  // keeps, and adds the other half of the partner's to its own (7 shuffles a token, not 24). Lane
  // bit 16 picks columns 4-7 or 0-3, bit 8 then 2-3 or 0-1 of those, bit 4 the odd or even one.
#pragma unroll
  for (int live = 8, lane_bit = 16; live > 1; live /= 2, lane_bit /= 2) {
    const bool upper = threadIdx.x & lane_bit;
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
#pragma unroll
      for (int j = 0; j < live / 2; ++j) {
        const float send = upper ? sum[t][j] : sum[t][j + live / 2];
        const float keep = upper ? sum[t][j + live / 2] : sum[t][j];
        sum[t][j] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, lane_bit);
      }
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kept_column = column_group * 8 + (lane >> 4 & 1) * 4 + (lane >> 3 & 1) * 2 + (lane >> 2 & 1);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) warp_sums[(warp * kTokens + t) * kSumPitch + kept_column] = sum[t][0];
  add_and_store<kTokens>(p, warp_sums, block_sums);
}

// Two blocks an SM, so that GEMM 2's blocks start beside GEMM 1's.
// Both passes in bf16: GEMM 1 rounds the latent to bf16 as it stores it, where cuBLAS's bf16 GEMM 1
// rounds it too.
__global__ void __launch_bounds__(kThreads, 2) stream_weights_mma(const Pass<bf16, bf16, bf16> p) {
  extern __shared__ float4 shared_words[];
  constexpr int kRows = kBatchRows<bf16, Math::kMma>;
  const int staged = staged_depth<bf16, Math::kMma>(p.part_depth), pitch = pair_pitch(staged);
  uint32_t* const pairs = reinterpret_cast<uint32_t*>(shared_words);  // [kMmaTokens][pitch] bf16 pairs
  float* const warp_sums = reinterpret_cast<float*>(pairs + kMmaTokens * pitch);
  float* const block_sums = warp_sums + kWarps * kMmaTokens * kSumPitch;

  const int rank = int(cg::this_cluster().block_rank());
  const int depth0 = rank * p.part_depth, depth_end = min(p.depth, depth0 + p.part_depth);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;  // the fragments' groupID and threadID_in_group
  const int column = int(blockIdx.x) * kColumns + group * 4;
  const bool inside = column < p.columns;  // columns come in whole groups of 8
  const bf16* const column_top = p.weights.at(0, inside ? column : 0);
  mla::launch_dependents();

  uint2 now[kChunks][4], next[kChunks][4];  // 4 columns of rows 2q, 2q + 1, 2q + 8, 2q + 9 of a chunk
  const auto fetch = [&](uint2(&batch)[kChunks][4], int first) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = depth0 + first + (i * kWarps + warp) * kChunkRows + 2 * quad + (r & 1) + (r >> 1) * 8;
        if (inside && row < depth_end) {
          batch[i][r] = load_streaming_8(column_top + int64_t(row) * p.weights.ld);
        } else {
          batch[i][r] = make_uint2(0, 0);
        }
      }
    }
  };
  // Two batches in flight before the wait: the weights do not depend on the kernel before.
  fetch(now, 0);
  if (kRows < staged) fetch(next, kRows);

  // GEMM 2's rows are GEMM 1's output: read them only once GEMM 1 has finished and flushed.
  if (p.after_primary) mla::wait_for_previous_kernel();
  // Only the call's tokens are staged: A's rows past them are zeros in registers. Each thread
  // loads every token's pair of a depth at once, as one 4-byte word where the rows allow it: every
  // GEMM 2 block reads the whole latent, so half-used sectors would double its L2 traffic.
  const bool whole_pairs = p.row_pitch % 2 == 0 && reinterpret_cast<uintptr_t>(p.rows + depth0) % 4 == 0;
#pragma unroll 1
  for (int k = threadIdx.x; k < staged / 2; k += kThreads) {
    const int depth = depth0 + 2 * k;
    const bf16* const top = p.rows + depth;
    uint32_t x[kMmaTokens];
    if (whole_pairs && depth + 1 < depth_end) {
#pragma unroll
      for (int token = 0; token < kMmaTokens; ++token) {
        x[token] = token < p.tokens ? *reinterpret_cast<const uint32_t*>(top + int64_t(token) * p.row_pitch) : 0u;
      }
    } else {
#pragma unroll
      for (int token = 0; token < kMmaTokens; ++token) {
        const bf16* const row = top + int64_t(token) * p.row_pitch;
        const bool live = token < p.tokens && depth < depth_end, both = live && depth + 1 < depth_end;
        x[token] = mla::pack_bf16(live ? mla::to_float(row[0]) : 0.0f, both ? mla::to_float(row[1]) : 0.0f);
      }
    }
#pragma unroll
    for (int token = 0; token < kMmaTokens; ++token) {
      if (token < p.tokens) pairs[token * pitch + k] = x[token];
    }
  }
  __syncthreads();

  float sums[4][4] = {};  // one mma's C fragment for each of the lane's 4 columns
  const bool low_live = group < p.tokens, high_live = group + 8 < p.tokens;  // A's rows group and group + 8
  for (int first = 0; first < staged; first += kRows) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const uint32_t* x = pairs + (first + (i * kWarps + warp) * kChunkRows) / 2 + quad;
      const uint32_t a[4] = {low_live ? x[group * pitch] : 0u, high_live ? x[(group + 8) * pitch] : 0u,
                             low_live ? x[group * pitch + 4] : 0u, high_live ? x[(group + 8) * pitch + 4] : 0u};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // Column j of each row: the low (even j) or high half of word j / 2; B wants the pair's
        // lower row in the low half.
        const auto word = [&](uint2 v) { return j < 2 ? v.x : v.y; };
        const uint32_t select = j % 2 == 0 ? 0x5410 : 0x7632;
        const uint32_t b0 = __byte_perm(word(now[i][0]), word(now[i][1]), select);
        const uint32_t b1 = __byte_perm(word(now[i][2]), word(now[i][3]), select);
        mla::mma_bf16(sums[j], a, b0, b1);
      }
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
#pragma unroll
      for (int r = 0; r < 4; ++r) now[i][r] = next[i][r];
    }
    if (first + 2 * kRows < staged) fetch(next, first + 2 * kRows);
  }

  // C's column n of mma j is the block's column 4n + j; its rows are tokens `group` and group + 8.
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int token = group + (c / 2) * 8, block_column = 4 * (2 * quad + c % 2) + j;
      warp_sums[(warp * kMmaTokens + token) * kSumPitch + block_column] = sums[j][c];
    }
  }
  add_and_store<kMmaTokens>(p, warp_sums, block_sums);
}

// ---- GEMMs on wgmma, operands swapped: C^T (64 output columns x kN tokens) = W^T @ rows^T -------
// A is a block's 64 columns of the weights (M = 64, MN-major: TMA boxes of kBoxDepths rows of the
// depth, each row 64 columns in 128 bytes, 128-byte swizzled); B is a tile of kN token rows (the
// latent for GEMM 2, hidden for GEMM 1; K-major: boxes of kN rows of 64 depths, zeros past the
// call's tokens and past the depth).
constexpr int kTileColumns = 64;                         // wgmma's M
constexpr int kBoxDepths = 64;                           // depths a box holds
constexpr int kWeightBoxBytes = kBoxDepths * 128;        // 64 depths x 64 columns of bf16
constexpr int kWarpgroup = 128;                          // a block is one warpgroup
constexpr int kTileTokens = 64;                          // tokens a tile holds past kMaxTokens
constexpr int kTiledMaxTokens = 512;
constexpr int kWideTileTokens = 128;                     // GEMM 2's token tile past 128 tokens
template <int kN>
constexpr int kRowsBoxBytes = kN * 128;                  // kN tokens x 64 depths of bf16

// d += A (64 x 16, MN-major: the first transpose flag) @ B (16 x kN, K-major); kN / 2 fp32 a thread.
template <int kN>
__device__ __forceinline__ void wgmma_swapped(float (&d)[kN / 2], uint64_t a, uint64_t b) {
  if constexpr (kN == 16) {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, accumulate, 1, 1, 1, 0;\n}\n"
        : MLA_WGMMA_ACC8(d, 0)
        : "l"(a), "l"(b), "r"(1));
  } else if constexpr (kN == 64) {
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MLA_WGMMA_D32 ", %32, %33, accumulate, 1, 1, 1, 0;\n}\n"
        : MLA_WGMMA_ACC32(d, 0)
        : "l"(a), "l"(b), "r"(1));
  } else {
    static_assert(kN == 128, "wgmma_swapped is written for 16, 64 and 128 tokens");
    asm volatile(
        "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MLA_WGMMA_D64 ", %64, %65, accumulate, 1, 1, 1, 0;\n}\n"
        : MLA_WGMMA_ACC64(d, 0)
        : "l"(a), "l"(b), "r"(1));
  }
}

// The 4 wgmma of one box: A's 16 depths are 16 rows of 128 bytes down its box, B's 32 bytes along
// its rows.
template <int kN>
__device__ __forceinline__ void multiply_box(float (&d)[kN / 2], uint32_t weights_box, uint32_t rows_box) {
#pragma unroll
  for (int k = 0; k < kBoxDepths / 16; ++k) {
    wgmma_swapped<kN>(d, mla::descriptor(weights_box + 16 * 128 * k, kWeightBoxBytes, 1024),
                      mla::descriptor(rows_box + 32 * k, 16, 1024));
  }
}

// One thread sets up `count` mbarriers of one arrival each, 8 bytes apart, and fences them for the
// copy engine; the block waits, so no copy completes on a barrier, and no thread waits at one,
// before it is set up.
__device__ __forceinline__ void init_barriers(uint32_t bars, int count) {
  if (threadIdx.x == 0) {
    for (int b = 0; b < count; ++b) mla::barrier_init(bars + 8 * b, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// wgmma's accumulator layout: rows (output columns) warp * 16 + lane / 4 and + 8, columns (tokens)
// 8 * i + 2 * (lane % 4) and + 1 in d[4 * i + 2 * half] and the next; use(column, token, first,
// second) for each such pair of adjacent tokens.
template <int kN, class Use>
__device__ __forceinline__ void for_each_pair(const float (&d)[kN / 2], Use use) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kN / 8; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      use(warp * 16 + lane / 4 + 8 * half, 8 * i + 2 * (lane % 4), d[4 * i + 2 * half], d[4 * i + 2 * half + 1]);
    }
  }
}

// GEMM 2: every box of the rank in flight at once, the weights' before griddepcontrol.wait; blockIdx.y
// picks the tile of kN tokens.
constexpr int kUpMaxRank = 512;                          // the whole rank in shared memory
constexpr int kUpBoxes = kUpMaxRank / kBoxDepths;
template <int kN>
constexpr int kUpSharedBytes = 1024 + kUpBoxes * (kWeightBoxBytes + kRowsBoxBytes<kN>) + kUpBoxes * 8;

struct UpMaps {
  CUtensorMap k, v, latent;  // w_up_k and w_up_v (rank x width), the latent (tokens x rank)
};

template <int kN>
__global__ void __launch_bounds__(kWarpgroup) up_on_wgmma(const __grid_constant__ UpMaps maps, bf16* __restrict__ out,
                                                         int tokens, int rank, int width) {
  extern __shared__ uint8_t shared_raw[];
  const uint32_t base = (mla::shared_address(shared_raw) + 1023) & ~1023u;  // the swizzle's 1024-byte rows
  const uint32_t weights = base, latent = base + kUpBoxes * kWeightBoxBytes;
  const uint32_t bars = latent + kUpBoxes * kRowsBoxBytes<kN>;
  const int boxes = int(mla::ceil_div(rank, kBoxDepths));
  const int column0 = int(blockIdx.x) * kTileColumns;  // a tile lies in k or in v: width % 64 == 0
  const int token0 = kN > kMaxTokens ? int(blockIdx.y) * kN : 0;  // up to kMaxTokens tokens are one tile
  const bool is_k = column0 < width;
  mla::launch_dependents();
  init_barriers(bars, boxes);
  if (threadIdx.x == 0) {
    for (int b = 0; b < boxes; ++b) {
      mla::barrier_expect_bytes(bars + 8 * b, kWeightBoxBytes + kRowsBoxBytes<kN>);
      mla::tma_load(weights + b * kWeightBoxBytes, is_k ? maps.k : maps.v, is_k ? column0 : column0 - width,
                    b * kBoxDepths, bars + 8 * b);
    }
    // The latent is GEMM 1's output: read it once GEMM 1 has finished and flushed.
    mla::wait_for_previous_kernel();
    asm volatile("fence.proxy.async.global;" ::: "memory");  // GEMM 1's generic stores, TMA's reads
    for (int b = 0; b < boxes; ++b) {
      mla::tma_load(latent + b * kRowsBoxBytes<kN>, maps.latent, b * kBoxDepths, token0, bars + 8 * b);
    }
  }

  float d[kN / 2] = {};
  mla::wgmma_fence();
  for (int b = 0; b < boxes; ++b) {
    mla::barrier_wait(bars + 8 * b, 0);
    multiply_box<kN>(d, weights + b * kWeightBoxBytes, latent + b * kRowsBoxBytes<kN>);
  }
  mla::wgmma_commit();
  mla::wgmma_wait<0>();
  mla::fence_registers(d);
  for_each_pair<kN>(d, [&](int column, int token, float first, float second) {
    bf16* const at = out + int64_t(token0 + token) * 2 * width + column0 + column;
    if (token0 + token < tokens) at[0] = __float2bfloat16(first);
    if (token0 + token + 1 < tokens) at[2 * width] = __float2bfloat16(second);
  });
}

// GEMM 1 from kMaxTokens + 1 tokens: a block owns 64 columns of the latent and a tile of kN tokens,
// and its cluster (along y) splits d_model into parts of part_boxes boxes; the boxes stream through
// a ring of kDownStages. The cluster's blocks add their sums through distributed shared memory,
// each adding and storing every splits-th.
constexpr int kDownStages = 4;
constexpr int kWideSplits = 16;    // the largest cluster sm_90 allows, to a kernel that opts in
constexpr int kLongPartBoxes = 8;  // 512 rows of d_model
// The block's sums, a token's 64 latent columns a row: 4 words of padding put the tokens 2q and
// 2q + 1 (q = lane % 4) that a store instruction's lanes write in different banks.
constexpr int kSumsRowPitch = kTileColumns + 4;
template <int kN>
constexpr int kDownSharedBytes =
    1024 + kDownStages * (kWeightBoxBytes + kRowsBoxBytes<kN>) + kN * kSumsRowPitch * 4 + kDownStages * 8;

struct DownMaps {
  CUtensorMap weights, hidden;  // w_down (d_model x rank), hidden (tokens x d_model)
};

template <int kN>
__global__ void __launch_bounds__(kWarpgroup) down_on_wgmma(const __grid_constant__ DownMaps maps,
                                                           bf16* __restrict__ latent, int tokens, int rank,
                                                           int depth_boxes, int part_boxes) {
  extern __shared__ uint8_t shared_raw[];
  const uint32_t base = (mla::shared_address(shared_raw) + 1023) & ~1023u;
  const uint32_t weights = base, rows = base + kDownStages * kWeightBoxBytes;
  const uint32_t bars = rows + kDownStages * kRowsBoxBytes<kN> + kN * kSumsRowPitch * 4;
  float* const block_sums = reinterpret_cast<float*>(shared_raw + (rows + kDownStages * kRowsBoxBytes<kN> -
                                                                    mla::shared_address(shared_raw)));
  const cg::cluster_group cluster = cg::this_cluster();
  const int splits = int(cluster.num_blocks()), part = int(cluster.block_rank());
  const int first_box = part * part_boxes, boxes = min(part_boxes, depth_boxes - first_box);
  const int column0 = int(blockIdx.x) * kTileColumns, token0 = int(blockIdx.z) * kN;
  mla::launch_dependents();
  const auto fetch = [&](int b) {  // box b of the part into its stage
    const uint32_t stage = b % kDownStages, bar = bars + 8 * stage;
    mla::barrier_expect_bytes(bar, kWeightBoxBytes + kRowsBoxBytes<kN>);
    mla::tma_load(weights + stage * kWeightBoxBytes, maps.weights, column0, (first_box + b) * kBoxDepths, bar);
    mla::tma_load(rows + stage * kRowsBoxBytes<kN>, maps.hidden, (first_box + b) * kBoxDepths, token0, bar);
  };
  init_barriers(bars, kDownStages);
  if (threadIdx.x == 0) {
    for (int b = 0; b < min(boxes, kDownStages); ++b) fetch(b);
  }

  float d[kN / 2] = {};
  for (int b = 0; b < boxes; ++b) {
    const int stage = b % kDownStages;
    mla::barrier_wait(bars + 8 * stage, (b / kDownStages) & 1);
    mla::wgmma_fence();
    multiply_box<kN>(d, weights + stage * kWeightBoxBytes, rows + stage * kRowsBoxBytes<kN>);
    mla::wgmma_commit();
    mla::wgmma_wait<0>();
    __syncthreads();  // every thread's wgmma has read the stage before it is filled again
    if (threadIdx.x == 0 && b + kDownStages < boxes) fetch(b + kDownStages);
  }
  mla::fence_registers(d);

  // Token-major, so that the adds below read and store consecutive columns: a warp stores 128
  // bytes of one latent row, where column-major sums made it 32 rows' 2 bytes each.
  for_each_pair<kN>(d, [&](int column, int token, float first, float second) {
    block_sums[token * kSumsRowPitch + column] = first;
    block_sums[(token + 1) * kSumsRowPitch + column] = second;
  });
  cluster.sync();
  constexpr int kColumnPairs = kTileColumns / 2;
  for (int i = part * kWarpgroup + int(threadIdx.x); i < kN * kColumnPairs; i += kWarpgroup * splits) {
    const int token = token0 + i / kColumnPairs, column = column0 + 2 * (i % kColumnPairs);
    if (column >= rank || token >= tokens) continue;  // rank is a multiple of 8: a pair lies inside
    const int at = (i / kColumnPairs) * kSumsRowPitch + 2 * (i % kColumnPairs);
    float2 total = make_float2(0.0f, 0.0f);
    for (int r = 0; r < splits; ++r) {
      const float2 sums = *reinterpret_cast<const float2*>(cluster.map_shared_rank(block_sums, r) + at);
      total.x += sums.x, total.y += sums.y;
    }
    *reinterpret_cast<uint32_t*>(latent + int64_t(token) * rank + column) = mla::pack_bf16(total.x, total.y);
  }
  // No block may leave while another still reads its sums.
  cluster.sync();
}

// ---- fp32 from 17 to 64 tokens: tiles on mma.sync, three TF32 passes -----------------------------
// Past 16 tokens the FFMA kernel's sums (8 a token per thread) no longer fit, and each weight
// feeds enough products that a tile pays: a block computes all tokens x kN columns, the tokens as
// A (m16n8k8, 16 rows a warp), the weights as B, each split into TF32 hi and lo and multiplied as
// lo*hi + hi*lo + hi*hi (fp32's accuracy). A ring of cp.async stages holds 32 depths of both: the
// weights MN-major as they lie (mma.sync's B fragment is read lane by lane, so wgmma's K-major rule
// does not apply and nothing is transposed), the tokens K-major. The depth is split over a cluster
// of up to 8 blocks, whose sums are added through distributed shared memory as above.
constexpr int kTf32Tokens = 64;  // a block holds every token of the call: past 64 step 10 is faster
constexpr int kTf32Depths = 32;  // depths a stage holds: four mma k-steps
constexpr int kTf32Stages = 4;
constexpr int kTokensPitch = kTf32Depths + 4;  // 36 words: an A fragment's 8 tokens x 4 depths in 32 banks
// A warp's tile: 16 tokens x kN / 2 columns; warps 0-3 and 4-7 take the block's two halves of the
// columns. A lane reads 4 columns (16 bytes) of each 32-column run of its half, at 4 * (lane / 4):
// mma j of run r computes the half's columns 32 r + 4 n + j (n = B's column, lane / 4 for b).
template <int kN>
struct Tf32Tile {
  static_assert(kN == 64 || kN == 128, "a warp's half is one or two 32-column runs");
  static constexpr int kRuns = kN / 64;  // 32-column runs in a warp's half
  // 8 words past a multiple of 32: a quarter warp's 16-byte reads (4 rows, 2 lane groups) take
  // all 32 banks once.
  static constexpr int kWeightsPitch = kN + 8;
  static constexpr int kStageFloats = kTf32Depths * kWeightsPitch + kTf32Tokens * kTokensPitch;
  static constexpr int kSumsPitch = kN + 4;
  static constexpr int kRingBytes = kTf32Stages * kStageFloats * 4;
  static constexpr int kSharedBytes = std::max(kRingBytes, kTf32Tokens * kSumsPitch * 4);
};

// x as mma's two operands, x = hi + lo exactly. hi is x rounded to TF32 as cvt.rna rounds it
// (half away from zero) in two integer instructions where cvt.rna takes four (its other two keep
// an infinity or NaN whole; here either makes lo a NaN, as it does after cvt.rna too). lo is what
// is left; the tensor cores truncate it to TF32, an error of 2^-21 of x at most and of either sign
// (lo's), so no bias.
struct Tf32Parts {
  uint32_t hi, lo;
};
__device__ __forceinline__ Tf32Parts tf32_parts(float x) {
  const uint32_t hi = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
  return {hi, __float_as_uint(x - __uint_as_float(hi))};
}

template <int kN>
__global__ void __launch_bounds__(kThreads, 2) tiles_on_3xtf32(const Pass<float, float, float> p) {
  using Tile = Tf32Tile<kN>;
  extern __shared__ float4 shared_words[];
  float* const ring = reinterpret_cast<float*>(shared_words);
  const cg::cluster_group cluster = cg::this_cluster();
  const int splits = int(cluster.num_blocks()), part = int(cluster.block_rank());
  const int depth0 = part * p.part_depth, depth_end = min(p.depth, depth0 + p.part_depth);
  const int chunks = int(mla::ceil_div(depth_end - depth0, kTf32Depths));  // at least 1: every part holds a stage
  const int column0 = int(blockIdx.x) * kN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;
  const int token_group = warp % 4, half = warp / 4;
  mla::launch_dependents();

  // Chunk c of the part into stage c % kTf32Stages: 16-byte runs by cp.async, zeros past the
  // depth, the columns and the tokens; the tokens' runs element by element where they are not 16
  // bytes aligned (hidden with an odd d_model, say).
  const auto stage_of = [&](int c) { return ring + (c % kTf32Stages) * Tile::kStageFloats; };
  const auto stage_weights = [&](int c) {
    float* const to = stage_of(c);
    for (int run = threadIdx.x; run < kTf32Depths * kN / 4; run += kThreads) {
      const int row = run / (kN / 4), column = column0 + 4 * (run % (kN / 4));
      const int depth = depth0 + c * kTf32Depths + row;
      float* const at = to + row * Tile::kWeightsPitch + 4 * (run % (kN / 4));
      if (depth < depth_end && column < p.columns) {  // columns and the k|v split are multiples of 8
        mla::copy_async_16(at, p.weights.at(depth, column));
      } else {
        mla::store_whole<mla::Space::kShared>(at, make_uint4(0, 0, 0, 0));
      }
    }
  };
  const bool whole_runs = p.row_pitch % 4 == 0 && mla::aligned16(p.rows);
  const auto stage_tokens = [&](int c) {
    float* const to = stage_of(c) + kTf32Depths * Tile::kWeightsPitch;
    for (int run = threadIdx.x; run < kTf32Tokens * kTf32Depths / 4; run += kThreads) {
      const int token = run / (kTf32Depths / 4), depth = depth0 + c * kTf32Depths + 4 * (run % (kTf32Depths / 4));
      float* const at = to + token * kTokensPitch + 4 * (run % (kTf32Depths / 4));
      const float* const from = p.rows + int64_t(token) * p.row_pitch + depth;
      if (token < p.tokens && whole_runs && depth + 4 <= depth_end) {
        mla::copy_async_16(at, from);
      } else {
        mla::copy_run_by_elements(at, [&](int q) {
          return token < p.tokens && depth + q < depth_end ? from + q : static_cast<const float*>(nullptr);
        });
      }
    }
  };
  // The weights of the first stages go before the wait: they do not depend on the kernel before.
  // A stage's weights then sit in the same commit group as its tokens or an earlier one.
  for (int c = 0; c < min(chunks, kTf32Stages - 1); ++c) stage_weights(c);
  if (p.after_primary) mla::wait_for_previous_kernel();
  for (int c = 0; c < kTf32Stages - 1; ++c) {
    if (c < chunks) stage_tokens(c);
    mla::commit_copies();
  }

  // The tensor cores round each running sum toward zero, a bias that grows with the chain: every
  // chunk's sums (12 mma deep) are added into `total` with FADD, which rounds to nearest.
  float total[Tile::kRuns * 4][4] = {};
  for (int c = 0; c < chunks; ++c) {
    mla::wait_for_copies(kTf32Stages - 2);
    __syncthreads();  // chunk c is in; every warp is done with the stage chunk c - 1 used
    if (c + kTf32Stages - 1 < chunks) {
      stage_weights(c + kTf32Stages - 1);
      stage_tokens(c + kTf32Stages - 1);
    }
    mla::commit_copies();

    const float* const weights = stage_of(c) + half * (kN / 2) + 4 * group;
    const float* const tokens =
        stage_of(c) + kTf32Depths * Tile::kWeightsPitch + (16 * token_group + group) * kTokensPitch + quad;
    float sums[Tile::kRuns * 4][4] = {};
#pragma unroll
    for (int k = 0; k < kTf32Depths; k += 8) {
      const Tf32Parts a[4] = {tf32_parts(tokens[k]), tf32_parts(tokens[8 * kTokensPitch + k]),
                              tf32_parts(tokens[k + 4]), tf32_parts(tokens[8 * kTokensPitch + k + 4])};
      const uint32_t a_hi[4] = {a[0].hi, a[1].hi, a[2].hi, a[3].hi}, a_lo[4] = {a[0].lo, a[1].lo, a[2].lo, a[3].lo};
#pragma unroll
      for (int r = 0; r < Tile::kRuns; ++r) {
        const float4 upper = *reinterpret_cast<const float4*>(weights + (k + quad) * Tile::kWeightsPitch + 32 * r);
        const float4 lower = *reinterpret_cast<const float4*>(weights + (k + quad + 4) * Tile::kWeightsPitch + 32 * r);
        const float b0[4] = {upper.x, upper.y, upper.z, upper.w}, b1[4] = {lower.x, lower.y, lower.z, lower.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const Tf32Parts first = tf32_parts(b0[j]), second = tf32_parts(b1[j]);
          float(&d)[4] = sums[4 * r + j];
          mla::mma_tf32(d, a_lo, first.hi, second.hi);  // the small terms first
          mla::mma_tf32(d, a_hi, first.lo, second.lo);
          mla::mma_tf32(d, a_hi, first.hi, second.hi);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < Tile::kRuns * 4; ++i) mla::add_into(total[i], sums[i]);
  }
  mla::wait_for_copies(0);
  __syncthreads();  // the ring is free: the block's sums take its place

  // C's rows are tokens `group` and group + 8 of the warp's 16, its columns 2 * quad and + 1 (n).
  float* const block_sums = ring;  // [token][kSumsPitch]
#pragma unroll
  for (int i = 0; i < Tile::kRuns * 4; ++i) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int token = 16 * token_group + group + (c / 2) * 8;
      const int column = half * (kN / 2) + 32 * (i / 4) + 4 * (2 * quad + c % 2) + i % 4;
      block_sums[token * Tile::kSumsPitch + column] = total[i][c];
    }
  }
  cluster.sync();
  for (int i = part * kThreads + int(threadIdx.x); i < kTf32Tokens * kN; i += kThreads * splits) {
    const int token = i / kN, column = column0 + i % kN;
    if (token >= p.tokens || column >= p.columns) continue;
    float sum = 0.0f;
    const int at = token * Tile::kSumsPitch + i % kN;
    for (int r = 0; r < splits; ++r) sum += cluster.map_shared_rank(block_sums, r)[at];
    p.out[int64_t(token) * p.out_pitch + column] = sum;
  }
  // No block may leave while another still reads its sums.
  cluster.sync();
}

// Whether GEMM 2 runs on wgmma: bf16, the whole rank in shared memory, and output tiles of 64
// columns that lie in w_up_k or in w_up_v.
bool up_takes_wgmma(const MlaProblem& p) {
  return p.dtype == MLA_BFLOAT16 && p.rank <= kUpMaxRank &&
         (p.heads * p.head_dim) % kTileColumns == 0;
}

template <int kN>
cudaError_t launch_up_on_wgmma(const MlaProblem& p, const bf16* latent, cudaStream_t stream) {
  const int64_t width = p.heads * p.head_dim;
  UpMaps maps;
  if (!mla::make_swizzled_map(&maps.k, p.w_up_k, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.rank, width, kBoxDepths) ||
      !mla::make_swizzled_map(&maps.v, p.w_up_v, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.rank, width, kBoxDepths) ||
      !mla::make_swizzled_map(&maps.latent, latent, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.tokens, p.rank, kN)) {
    return cudaErrorInvalidValue;
  }
  const cudaError_t err = mla::allow_shared_memory(up_on_wgmma<kN>, size_t(kUpSharedBytes<kN>));
  if (err != cudaSuccess) return err;
  return mla::launch(true, mla::kNoClusters, up_on_wgmma<kN>,
                     dim3(unsigned(2 * width / kTileColumns), unsigned(mla::ceil_div(p.tokens, kN))), dim3(kWarpgroup),
                     size_t(kUpSharedBytes<kN>), stream, maps, static_cast<bf16*>(p.out), int(p.tokens), int(p.rank),
                     int(width));
}

// GEMM 1 on wgmma for kMaxTokens + 1 to kTiledMaxTokens bf16 tokens, in tiles of kTileTokens, then
// GEMM 2 on wgmma as its programmatic dependent. d_model is split so that the blocks about fill the
// GPU once, into parts of whole boxes.
cudaError_t launch_token_tiles(const MlaProblem& p, cudaStream_t stream) {
  bf16* latent = static_cast<bf16*>(p.workspace);
  DownMaps maps;
  if (!mla::make_swizzled_map(&maps.weights, p.w_down, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.d_model, p.rank,
                              kBoxDepths) ||
      !mla::make_swizzled_map(&maps.hidden, p.hidden, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.tokens, p.d_model,
                              kTileTokens)) {
    return cudaErrorInvalidValue;
  }
  const int64_t tiles = mla::ceil_div(p.rank, kTileColumns) * mla::ceil_div(p.tokens, kTileTokens);
  const int depth_boxes = int(mla::ceil_div(p.d_model, kBoxDepths));
  const int64_t fill = std::max<int64_t>(1, mla::multiprocessor_count() / tiles);
  // Where clusters of 8 would leave parts longer than kLongPartBoxes (V3's d_model: 112 boxes, 14
  // a part), clusters of up to kWideSplits: twice the blocks stream half as far. Only where GEMM 2,
  // which starts beside GEMM 1 as its programmatic dependent, is one wave: at V3's 512 GEMM 2
  // blocks the wider split measured slower.
  const int64_t up_tile = p.tokens > kWideTileTokens ? kWideTileTokens : kTileTokens;
  const int64_t up_blocks = 2 * p.heads * p.head_dim / kTileColumns * mla::ceil_div(p.tokens, up_tile);
  const bool wide =
      mla::ceil_div(depth_boxes, kMaxSplits) > kLongPartBoxes && up_blocks <= mla::multiprocessor_count();
  const int most_splits = wide ? kWideSplits : kMaxSplits;
  const int part_boxes = int(mla::ceil_div(depth_boxes, std::min<int64_t>({most_splits, fill, depth_boxes})));
  const int splits = int(mla::ceil_div(depth_boxes, part_boxes));  // every part holds a box
  const int bytes = kDownSharedBytes<kTileTokens>;
  cudaError_t err = mla::allow_shared_memory(down_on_wgmma<kTileTokens>, size_t(bytes));
  if (err == cudaSuccess && splits > kMaxSplits) {
    err = cudaFuncSetAttribute(down_on_wgmma<kTileTokens>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  }
  if (err != cudaSuccess) return err;
  err = mla::launch(false, unsigned(splits), down_on_wgmma<kTileTokens>,
                    dim3(unsigned(mla::ceil_div(p.rank, kTileColumns)), unsigned(splits),
                         unsigned(mla::ceil_div(p.tokens, kTileTokens))),
                    dim3(kWarpgroup), size_t(bytes), stream, maps, latent, int(p.tokens), int(p.rank), depth_boxes,
                    part_boxes);
  if (err != cudaSuccess) return err;
  // Past 128 tokens GEMM 2 takes 128-token tiles: a block's weight columns are loaded once for
  // twice the tokens, and its grid is one wave at 256 tokens where 64-token tiles made two.
  return p.tokens > kWideTileTokens ? launch_up_on_wgmma<kWideTileTokens>(p, latent, stream)
                                    : launch_up_on_wgmma<kTileTokens>(p, latent, stream);
}

// A pass on the TF32 tiles: its depth split over a cluster, in parts of whole stages, until the
// blocks fill the GPU twice over (two an SM).
template <int kN>
cudaError_t launch_tf32_pass(Pass<float, float, float> pass, cudaStream_t stream) {
  const int64_t tiles = mla::ceil_div(pass.columns, kN);
  const int64_t stages = mla::ceil_div(pass.depth, kTf32Depths);
  const int64_t fill = std::max<int64_t>(1, 2 * mla::multiprocessor_count() / tiles);
  const int64_t part_stages = mla::ceil_div(stages, std::min<int64_t>({kMaxSplits, fill, stages}));
  const int splits = int(mla::ceil_div(stages, part_stages));  // every part holds a stage
  pass.part_depth = int(part_stages * kTf32Depths);
  const int bytes = Tf32Tile<kN>::kSharedBytes;
  const cudaError_t err = mla::allow_shared_memory(tiles_on_3xtf32<kN>, size_t(bytes));
  if (err != cudaSuccess) return err;
  return mla::launch(pass.after_primary, unsigned(splits), tiles_on_3xtf32<kN>,
                     dim3(unsigned(tiles), unsigned(splits), 1), dim3(kThreads), size_t(bytes), stream, pass);
}

// fp32 from kMaxTokens + 1 to kTf32Tokens tokens, all of them in each block: GEMM 1 in
// 64-column tiles (rank 512 makes 8), then GEMM 2 as its programmatic dependent in
// 128-column tiles, each of which reads its tokens' latent once for twice the weights.
cudaError_t launch_tf32_tiles(const MlaProblem& p, cudaStream_t stream) {
  const mla::Problem<float> m = mla::Problem<float>::of(p);
  float* latent = static_cast<float*>(p.workspace);
  const Pass<float, float, float> down{m.hidden, p.d_model, m.down, latent, p.rank, int(p.tokens), int(p.d_model),
                                       int(p.rank), 0, false};
  const Pass<float, float, float> up{latent, p.rank, m.up, m.out, m.columns, int(p.tokens), int(p.rank), int(m.columns),
                                     0, true};
  const cudaError_t err = launch_tf32_pass<64>(down, stream);
  return err != cudaSuccess ? err : launch_tf32_pass<128>(up, stream);
}

// A pass's split of its depth over a cluster: enough blocks to fill the GPU once, at most
// kMaxSplits, a row of each part for every depth group, and at least least_rows rows a part.
int splits_of(int64_t columns, int64_t depth, int least_rows) {
  const int64_t column_blocks = mla::ceil_div(columns, kColumns);
  const int64_t fill = std::max<int64_t>(1, mla::multiprocessor_count() / column_blocks);
  return int(std::min<int64_t>({kMaxSplits, fill, mla::ceil_div(depth, kDepthGroups), mla::ceil_div(depth, least_rows)}));
}
// A part's least depth: 512 rows, since below that the cluster's barriers and adds cost more than
// the stream they share out (GEMM 1 at V2-Lite, 2,048 deep: 4.7 µs over clusters of 4 against 5.9
// over 8 at 16 bf16 tokens, H100), but for one fp32 token, whose wider rows (32 bytes of 8 weights)
// were measured slower over 4 (10.4 against 10.1 µs at V2-Lite).
template <typename T>
int least_part_rows(int64_t tokens) { return std::is_same_v<T, float> && tokens == 1 ? 1 : 512; }
int part_depth_of(int64_t depth, int splits) { return int(mla::ceil_div(depth, splits)); }

// use(std::integral_constant<int, n>()) for the token count n the FFMA kernels are compiled for:
// the fewest of 1, 2, 4, 8 and 16 that holds `tokens` (a thread keeps n x 8 sums in registers).
template <class Use>
auto with_compiled_tokens(int64_t tokens, Use use) {
  if (tokens <= 1) return use(std::integral_constant<int, 1>());
  if (tokens <= 2) return use(std::integral_constant<int, 2>());
  if (tokens <= 4) return use(std::integral_constant<int, 4>());
  if (tokens <= 8) return use(std::integral_constant<int, 8>());
  return use(std::integral_constant<int, kMaxTokens>());
}

template <typename T>
int pass_shared_bytes(int64_t tokens, int part_depth) {
  if (math_for<T>(tokens) == Math::kMma) {
    return kMmaTokens * pair_pitch(staged_depth<T, Math::kMma>(part_depth)) * 4 + sums_bytes(kMmaTokens);
  }
  const int staged = staged_depth<T, Math::kFfma>(part_depth);
  return with_compiled_tokens(tokens, [&](auto n) { return staged * int(n) * 4 + sums_bytes(n); });
}

template <typename T>
bool fits(const MlaProblem& p) {
  const int64_t columns = 2 * p.heads * p.head_dim;
  const int least = least_part_rows<T>(p.tokens);
  const int down_part = part_depth_of(p.d_model, splits_of(p.rank, p.d_model, least));
  const int up_part = part_depth_of(p.rank, splits_of(columns, p.rank, least));
  return pass_shared_bytes<T>(p.tokens, down_part) <= kSharedBudget &&
         pass_shared_bytes<T>(p.tokens, up_part) <= kSharedBudget;
}

// Batches past kMaxTokens: fp32 up to kTf32Tokens on the TF32 tiles, whose copies take any
// hidden; bf16 on wgmma in token tiles, where TMA reads hidden's rows too, so they must be whole
// 16-byte runs.
bool takes_token_tiles(const MlaProblem* p) {
  if (p->dtype == MLA_FLOAT32) return p->tokens <= kTf32Tokens;
  return p->dtype == MLA_BFLOAT16 && p->tokens <= kTiledMaxTokens && up_takes_wgmma(*p) && p->d_model % 8 == 0 &&
         mla::aligned16(p->hidden);
}

bool takes_fast_path(const MlaProblem* p) {
  const bool sizes = p->rank % 8 == 0 && (p->heads * p->head_dim) % 8 == 0 &&
                     p->d_model < (int64_t(1) << 30) && p->rank < (int64_t(1) << 30) &&
                     2 * p->heads * p->head_dim < (int64_t(1) << 30);
  const bool aligned = mla::aligned16(p->w_down) && mla::aligned16(p->w_up_k) &&
                       mla::aligned16(p->w_up_v);
  if (!mla::on_hopper() || !sizes || !aligned) return false;
  if (p->tokens > kMaxTokens) return takes_token_tiles(p);
  return p->dtype == MLA_FLOAT32 ? fits<float>(*p) : fits<bf16>(*p);
}

template <typename Kernel, typename P>
cudaError_t launch_pass(Kernel kernel, const P& pass, int splits, cudaStream_t stream) {
  using T = std::remove_const_t<std::remove_pointer_t<decltype(pass.weights.left)>>;
  const int bytes = pass_shared_bytes<T>(pass.tokens, pass.part_depth);
  cudaError_t err = mla::allow_shared_memory(kernel, size_t(bytes));
  if (err != cudaSuccess) return err;
  return mla::launch(pass.after_primary, unsigned(splits), kernel,
                     dim3(unsigned(mla::ceil_div(pass.columns, kColumns)), unsigned(splits), 1), dim3(kThreads),
                     size_t(bytes), stream, pass);
}

// GEMM 1's pass: the tokens of hidden and w_down into the latent, d_model split `splits` ways.
template <typename T, typename Latent>
Pass<T, T, Latent> down_pass(const MlaProblem& p, const mla::Problem<T>& m, Latent* latent, int splits) {
  return {m.hidden, p.d_model, m.down, latent, p.rank, int(p.tokens), int(p.d_model), int(p.rank),
          part_depth_of(p.d_model, splits), false};
}

// GEMM 1, then GEMM 2 as its programmatic dependent, the latent between them in the workspace as
// Latent: bf16 on the tensor-core path, which rounds it to bf16 for its A fragments anyway and
// so halves the bytes each GEMM 2 block reads of it; fp32 on FFMA.
template <typename T, typename Latent, typename DownKernel, typename UpKernel>
cudaError_t launch_passes(const MlaProblem& p, cudaStream_t stream, DownKernel down_kernel, UpKernel up_kernel) {
  const mla::Problem<T> m = mla::Problem<T>::of(p);
  Latent* latent = static_cast<Latent*>(p.workspace);
  const int least = least_part_rows<T>(p.tokens);
  const int down_splits = splits_of(p.rank, p.d_model, least), up_splits = splits_of(m.columns, p.rank, least);
  const Pass<T, T, Latent> down = down_pass(p, m, latent, down_splits);
  const Pass<T, Latent, T> up{latent, p.rank, m.up, m.out, m.columns, int(p.tokens), int(p.rank), int(m.columns),
                              part_depth_of(p.rank, up_splits), true};
  const cudaError_t err = launch_pass(down_kernel, down, down_splits, stream);
  return err != cudaSuccess ? err : launch_pass(up_kernel, up, up_splits, stream);
}

// GEMM 1 (on FFMA for one token, on mma.sync from two), then GEMM 2 on wgmma as its programmatic
// dependent, the latent between them in bf16, as wgmma takes it.
cudaError_t launch_down_then_up_on_wgmma(const MlaProblem& p, cudaStream_t stream) {
  bf16* latent = static_cast<bf16*>(p.workspace);
  const int splits = splits_of(p.rank, p.d_model, least_part_rows<bf16>(p.tokens));
  const Pass<bf16, bf16, bf16> down = down_pass(p, mla::Problem<bf16>::of(p), latent, splits);
  const cudaError_t err = math_for<bf16>(p.tokens) == Math::kMma
                              ? launch_pass(stream_weights_mma, down, splits, stream)
                              : launch_pass(stream_weights_ffma<bf16, bf16, bf16, 1>, down, splits, stream);
  return err != cudaSuccess ? err : launch_up_on_wgmma<kMmaTokens>(p, latent, stream);
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (p.tokens > kMaxTokens) return launch_token_tiles(p, stream);
    if (up_takes_wgmma(p)) return launch_down_then_up_on_wgmma(p, stream);
    if (math_for<T>(p.tokens) == Math::kMma) {
      return launch_passes<T, bf16>(p, stream, stream_weights_mma, stream_weights_mma);
    }
    return launch_passes<T, float>(p, stream, stream_weights_ffma<T, T, float, 1>,  // one token
                                   stream_weights_ffma<T, float, T, 1>);
  } else {
    if (p.tokens > kMaxTokens) return launch_tf32_tiles(p, stream);
    return with_compiled_tokens(p.tokens, [&](auto n) {
      return launch_passes<T, float>(p, stream, stream_weights_ffma<T, T, float, n()>,
                                     stream_weights_ffma<T, float, T, n()>);
    });
  }
}

}  // namespace

extern "C" int mla_takes(const MlaProblem* p) { return takes_fast_path(p); }

// The latent between the two kernels: tokens x rank, sized for fp32 (the tensor-core path keeps bf16).
extern "C" size_t mla_workspace_bytes(const MlaProblem* p) {
  if (!takes_fast_path(p)) return 0;
  return size_t(mla::round_up(p->tokens * p->rank * 4, 256));
}

extern "C" cudaError_t mla_launch(const MlaProblem* p, cudaStream_t stream) {
  if (!takes_fast_path(p) || p->workspace == nullptr) return cudaErrorNotSupported;  // the binding runs step 4
  return mla::dispatch(p, stream, launch<float>, launch<bf16>);
}
