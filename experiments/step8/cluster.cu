// An experiment after step 7 (not a course step: it measured no faster; kernels/NOTES.md, "Step 8
// experiment"): on Hopper, a cluster of 8 blocks splits each token tile's reduction.
//
// Step 7's toy blocks each wait for about 80 KB before they multiply: every block needs all of
// w_down (its tokens' whole latent row is a sum over all of d_model), its hidden rows and half of
// [w_up_k | w_up_v]; the 96 blocks together pull 7.7 MB from L2 for a 0.9 MB problem. Here:
// - A tile of 32 tokens belongs to a cluster of 8 blocks (sm_90). Block c reduces only the c-th
//   eighth of d_model in GEMM 1 and computes the c-th eighth of the output columns in GEMM 2, so
//   it loads an eighth of w_down and of the up-projections: 16 KB at the toy in fp32.
// - Its partial latent (32 tokens x rank, fp32) is cut into 8 column shares, and block c adds up
//   share c: GEMM 1 stores each partial straight into the shared memory of the block that owns
//   its share (distributed shared memory, 8-byte stores), then c stores the sum of its share into
//   all 8 blocks (16-byte stores), so each holds the whole latent tile for GEMM 2; a cluster
//   barrier after each. The latent is summed once, not recomputed per column split.
// - All copies are issued before any arithmetic (16-byte cp.async, element by element where a
//   run is misaligned or crosses an edge), so a block waits on L2 once.
// - A warp owns 4 tokens and a lane one or two columns of a chunk, so the tokens' operands are
//   4-deep vectors that the whole warp reads at once (a broadcast) and the weights one per lane.
// FFMA in both dtypes; the inputs stay in their dtype in shared memory. The launcher refuses
// (cudaErrorNotSupported) a shape whose block share does not fit kSharedBudget of shared memory;
// experiments/step8/lab.py runs only shapes that fit (the toy's widths, not V2-Lite's).
#include <stdint.h>

#include <cooperative_groups.h>

#include "mla_common.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTokens = 32;                    // tokens per tile; a warp owns 4 of them
constexpr int kTokensPerWarp = kTokens / kWarps;
constexpr int kCluster = 8;                    // the portable maximum: blocks per token tile
constexpr int kChunk = 32;                     // shared rows of weights are whole chunks of columns
constexpr int kRowAlign = 8;                   // elements: shared rows stay 16-byte aligned
constexpr size_t kSharedBudget = 160 * 1024;   // also in experiments/step8/lab.py

// The launcher's sizes, the same for every block. Rows of the shared tiles are padded with zeros,
// so the inner loops have no bounds tests.
struct Geometry {
  int64_t tokens, d_model, rank, columns;  // columns = 2 * heads * head_dim
  int depth_share;     // d_model rows per block in GEMM 1, a multiple of kRowAlign
  int rank_padded;     // GEMM 1's columns: rank in whole chunks
  int share;           // latent columns each block adds up, a multiple of 4
  int shares;          // shares that hold latent columns: GEMM 2's depth is shares * share
  int column_share;    // output columns per block, a multiple of kRowAlign
  int columns_padded;  // GEMM 2's columns: column_share in whole chunks
};

Geometry geometry_of(const MlaProblem& p) {
  Geometry g;
  g.tokens = p.tokens, g.d_model = p.d_model, g.rank = p.rank, g.columns = 2 * p.heads * p.head_dim;
  g.depth_share = int(mla::round_up(mla::ceil_div(p.d_model, kCluster), kRowAlign));
  g.rank_padded = int(mla::round_up(p.rank, kChunk));
  g.share = int(mla::round_up(mla::ceil_div(p.rank, kCluster), 4));
  g.shares = int(mla::ceil_div(p.rank, g.share));
  g.column_share = int(mla::round_up(mla::ceil_div(g.columns, kCluster), kRowAlign));
  g.columns_padded = int(mla::round_up(g.column_share, kChunk));
  return g;
}

// Shared memory, in this order: hidden [kTokens][depth_share], w_down [depth_share][rank_padded],
// up [shares * share][columns_padded] (inputs' dtype); then two fp32 tiles of latent columns
// by share, [kCluster][kTokens][share]: the inbox (partials of this block's share, one tile
// per sending block) and the whole latent. Every part is a multiple of 16 bytes.
template <typename T>
struct Tiles {
  T *hidden, *down, *up;
  float *inbox, *latent;
  __device__ Tiles(uint8_t* base, const Geometry& g) {
    hidden = reinterpret_cast<T*>(base);
    down = hidden + kTokens * g.depth_share;
    up = down + g.depth_share * g.rank_padded;
    inbox = reinterpret_cast<float*>(up + g.shares * g.share * g.columns_padded);
    latent = inbox + kCluster * kTokens * g.share;
  }
};

size_t shared_bytes(const Geometry& g, size_t element_bytes) {
  return element_bytes * size_t(kTokens * g.depth_share + g.depth_share * g.rank_padded +
                                g.shares * g.share * g.columns_padded) +
         sizeof(float) * size_t(2 * kCluster * kTokens * g.share);
}

// Stages `rows` x `stride` elements of `from` (a row-major matrix, read from (row0, column0))
// into `to`: zeros past row_end and column_end, so padded rows and columns read as 0.
template <typename T>
__device__ void stage(T* to, int rows, int stride, const mla::WeightColumns<T>& from, int64_t row0,
                      int64_t row_end, int64_t column0, int64_t column_end) {
  constexpr int kRun = 16 / sizeof(T);
  const int runs_per_row = stride / kRun;
  for (int run = threadIdx.x; run < rows * runs_per_row; run += kThreads) {
    const int r = run / runs_per_row, q = (run - r * runs_per_row) * kRun;
    const int64_t row = row0 + r, column = column0 + q;
    const bool inside = row < row_end;
    if (inside && column + kRun <= column_end && (column >= from.split || column + kRun <= from.split)) {
      const T* source = from.at(row, column);
      if (mla::aligned16(source)) {
        mla::copy_async_16(to + r * stride + q, source);
        continue;
      }
    }
    mla::copy_run_by_elements(to + r * stride + q, [&](int e) -> const T* {
      return inside && column + e < column_end ? from.at(row, column + e) : nullptr;
    });
  }
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void load_columns(const float* p, float (&b)[1]) { b[0] = *p; }
__device__ __forceinline__ void load_columns(const __nv_bfloat16* p, float (&b)[1]) { b[0] = mla::to_float(*p); }
__device__ __forceinline__ void load_columns(const float* p, float (&b)[2]) {
  const float2 pair = *reinterpret_cast<const float2*>(p);
  b[0] = pair.x, b[1] = pair.y;
}
__device__ __forceinline__ void load_columns(const __nv_bfloat16* p, float (&b)[2]) {
  const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  b[0] = pair.x, b[1] = pair.y;
}

// Stores into another block's shared memory, at a generic address from map_shared_rank.
__device__ __forceinline__ void store_remote(float* at, const float (&values)[1]) { *at = values[0]; }
__device__ __forceinline__ void store_remote(float* at, const float (&values)[2]) {
  asm volatile("st.v2.f32 [%0], {%1, %2};" ::"l"(at), "f"(values[0]), "f"(values[1]) : "memory");
}
__device__ __forceinline__ void store_remote(float* at, float4 v) {
  asm volatile("st.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(at), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
// Output columns [n, n + kLaneColumns) of one token's row, those before `end`; a pair whole where
// it is aligned (n is even, and so is the row length, so that depends only on `out` itself).
template <typename T, int kLaneColumns>
__device__ __forceinline__ void store_output(T* row, int64_t n, int64_t end, const float (&values)[kLaneColumns]) {
  if (kLaneColumns == 2 && n + 1 < end && reinterpret_cast<uintptr_t>(row + n) % (2 * sizeof(T)) == 0) {
    if constexpr (sizeof(T) == 4) {
      mla::store_whole<mla::Space::kGlobal>(row + n, make_uint2(__float_as_uint(values[0]), __float_as_uint(values[1])));
    } else {
      *reinterpret_cast<uint32_t*>(row + n) = mla::pack_bf16(values[0], values[kLaneColumns - 1]);
    }
    return;
  }
#pragma unroll
  for (int c = 0; c < kLaneColumns; ++c) {
    if (n + c < end) row[n + c] = mla::from_float<T>(values[c]);
  }
}

// result[token][column] = sum over k of a(token, k) * b[k][column] for the tile's kTokens tokens
// and `width` columns, with A in `parts` parts of part_depth columns each (the latent, by share;
// hidden in one part): a(token, k) = a[(k / part_depth) * part_stride + token * a_stride +
// k % part_depth]. part_depth is a multiple of 4. Warp w takes tokens w, w + 8, ...; lane l the
// kLaneColumns columns from l * kLaneColumns of each chunk of 32 * kLaneColumns, handed to
// store(token, first column, values) together (so that a pair is stored as one 8-byte store).
template <int kLaneColumns, typename TA, typename TB, class Store>
__device__ __forceinline__ void multiply(const TA* a, int a_stride, int parts, int part_depth, int part_stride,
                                         const TB* b, int b_stride, int width, Store store) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int chunk = 0; chunk < width; chunk += 32 * kLaneColumns) {
    const int column = chunk + lane * kLaneColumns;
    float sum[kTokensPerWarp][kLaneColumns] = {};
    for (int part = 0; part < parts; ++part) {
      const TA* a_part = a + part * part_stride + warp * a_stride;
      const TB* b_part = b + part * part_depth * b_stride + column;
#pragma unroll 2
      for (int k = 0; k < part_depth; k += 4) {
        float4 x[kTokensPerWarp];
#pragma unroll
        for (int t = 0; t < kTokensPerWarp; ++t) x[t] = load4(a_part + t * kWarps * a_stride + k);
        float w[4][kLaneColumns];
#pragma unroll
        for (int d = 0; d < 4; ++d) load_columns(b_part + (k + d) * b_stride, w[d]);
#pragma unroll
        for (int t = 0; t < kTokensPerWarp; ++t) {
#pragma unroll
          for (int c = 0; c < kLaneColumns; ++c) {
            sum[t][c] = fmaf(x[t].x, w[0][c], sum[t][c]);
            sum[t][c] = fmaf(x[t].y, w[1][c], sum[t][c]);
            sum[t][c] = fmaf(x[t].z, w[2][c], sum[t][c]);
            sum[t][c] = fmaf(x[t].w, w[3][c], sum[t][c]);
          }
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kTokensPerWarp; ++t) store(warp + t * kWarps, column, sum[t]);
  }
}

// Two columns per lane where the width is whole chunks of 64 (fewer shared loads per multiply-add),
// else one: a padded half chunk would cost as much as the columns it holds.
template <typename TA, typename TB, class Store>
__device__ __forceinline__ void multiply_tile(const TA* a, int a_stride, int parts, int part_depth, int part_stride,
                                              const TB* b, int b_stride, int width, Store store) {
  if (width % 64 == 0) {
    multiply<2>(a, a_stride, parts, part_depth, part_stride, b, b_stride, width, store);
  } else {
    multiply<1>(a, a_stride, parts, part_depth, part_stride, b, b_stride, width, store);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    cluster_kernel(const T* __restrict__ hidden, const T* __restrict__ w_down, const T* __restrict__ w_up_k,
                   const T* __restrict__ w_up_v, T* __restrict__ out, Geometry g) {
  extern __shared__ __align__(16) uint8_t shared[];
  const Tiles<T> tile(shared, g);
  const cg::cluster_group cluster = cg::this_cluster();
  const uint32_t block = cluster.block_rank();
  const int64_t token0 = int64_t(blockIdx.x / kCluster) * kTokens;
  const int64_t depth0 = int64_t(block) * g.depth_share;
  const int64_t column0 = int64_t(block) * g.column_share;
  const int64_t depth_end = min(g.d_model, depth0 + g.depth_share);
  const int64_t column_end = min(g.columns, column0 + g.column_share);
  const int share_tile = kTokens * g.share;  // floats of one share of a latent tile

  stage(tile.hidden, kTokens, g.depth_share, mla::WeightColumns<T>{hidden, hidden, g.d_model, g.d_model}, token0,
        g.tokens, depth0, depth_end);
  stage(tile.down, g.depth_share, g.rank_padded, mla::WeightColumns<T>{w_down, w_down, g.rank, g.rank}, depth0,
        depth_end, 0, g.rank);
  const int64_t width = g.columns / 2;
  stage(tile.up, g.shares * g.share, g.columns_padded, mla::WeightColumns<T>{w_up_k, w_up_v, width, width}, 0,
        g.rank, column0, column_end);
  mla::commit_copies();
  cluster.barrier_arrive();  // this block runs: after the wait below, the others may store into it
  mla::wait_for_copies(0);
  __syncthreads();
  cluster.barrier_wait();

  // GEMM 1 over this block's eighth of d_model: a partial sum of every latent column, each
  // stored into the inbox of the block that owns its share (a lane's columns share one owner).
  float* const inbox = tile.inbox + block * share_tile;
  multiply_tile(tile.hidden, g.depth_share, 1, g.depth_share, 0, tile.down, g.rank_padded, g.rank_padded,
                [&](int token, int column, const auto& values) {
                  const int owner = column / g.share;  // none (>= kCluster) only past the rank
                  const int offset = token * g.share + column - owner * g.share;
                  if (owner < kCluster) store_remote(cluster.map_shared_rank(inbox + offset, owner), values);
                });
  cluster.barrier_arrive();
  cluster.barrier_wait();

  // Add up this block's share and store it into every block; latent columns past the rank are 0
  // (GEMM 2's padded depth).
  float* const latent = tile.latent + block * share_tile;
  const int quads = g.share / 4;
  for (int i = threadIdx.x; i < kTokens * quads; i += kThreads) {
    const int offset = (i / quads) * g.share + (i % quads) * 4;
    float4 total = load4(tile.inbox + offset);
#pragma unroll
    for (int from = 1; from < kCluster; ++from) {
      const float4 part = load4(tile.inbox + from * share_tile + offset);
      total.x += part.x, total.y += part.y, total.z += part.z, total.w += part.w;
    }
    const int first = int(block) * g.share + (i % quads) * 4;
    if (first + 4 > g.rank) {
      total.x = first < g.rank ? total.x : 0.0f;
      total.y = first + 1 < g.rank ? total.y : 0.0f;
      total.z = first + 2 < g.rank ? total.z : 0.0f;
      total.w = 0.0f;
    }
#pragma unroll
    for (int to = 0; to < kCluster; ++to) {
      store_remote(cluster.map_shared_rank(latent + offset, to), total);
    }
  }
  // After this barrier no block touches another's shared memory: each may finish and exit.
  cluster.barrier_arrive();
  cluster.barrier_wait();

  // GEMM 2: the whole latent tile against this block's columns of [w_up_k | w_up_v].
  multiply_tile(tile.latent, g.share, g.shares, g.share, share_tile, tile.up, g.columns_padded, g.columns_padded,
                [&](int token, int column, const auto& values) {
                  if (token0 + token < g.tokens) {
                    store_output(out + (token0 + token) * g.columns, column0 + column, column_end, values);
                  }
                });
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
  const Geometry g = geometry_of(p);
  const size_t bytes = shared_bytes(g, sizeof(T));
  if (bytes > kSharedBudget) return cudaErrorNotSupported;  // the lab runs only shapes that fit
  cudaError_t err = mla::allow_shared_memory(cluster_kernel<T>, bytes);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCluster;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(mla::ceil_div(p.tokens, kTokens) * kCluster));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = bytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, cluster_kernel<T>, static_cast<const T*>(p.hidden),
                           static_cast<const T*>(p.w_down), static_cast<const T*>(p.w_up_k),
                           static_cast<const T*>(p.w_up_v), static_cast<T*>(p.out), g);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)
