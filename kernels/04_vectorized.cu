// Step 4 — vectorized: 16-byte accesses, conflict-free shared memory, and a grid that fills the GPU.
//
// Same tiles as step 3 (32 tokens x 128 columns, 16-deep weight slices, 4 x 4 results per
// thread). What changed, each for a bottleneck notebook 05 measured on step 3:
// - Global loads are 16 bytes per thread (4 floats or 8 bf16) and the output is written 4
//   columns per thread, a warp covering one contiguous 512-byte (fp32) run of a stacked output
//   row. A run that is misaligned (a view with a storage offset), crosses the k|v boundary or
//   hangs over a tail falls back to scalar accesses, so every valid shape stays correct.
// - A thread's 4 columns are adjacent, so its B values arrive in one 16-byte shared-memory read,
//   and the A tile is kept token-major: all lanes of a warp read the same A address (a
//   broadcast), and the stores that fill it no longer collide on one bank as step 3's
//   transposed stores did.
// - Step 3 launched tokens / 32 blocks: 12 for the toy on a 132-SM GPU. The output columns of a
//   token tile are now split over several blocks when that is faster, each recomputing the
//   tile's latent (mla::choose_column_splits counts that cost).
//
// Launch limit: as step 3, rank <= 640 (the fp32 latent tile in shared memory).
#include <stdint.h>

#include "mla_common.cuh"

namespace {

constexpr int kTokens = 32;
constexpr int kColumns = 128;
constexpr int kDepth = 16;
constexpr int kThreads = 256;  // 8 row groups x 32 lanes; a lane owns 4 adjacent columns
constexpr int kMicro = 4;

template <typename T>
constexpr int kVector = 16 / sizeof(T);  // elements in one 16-byte access

using Tile = float[kMicro][kMicro];

__device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// One 16-byte global load, widened to floats in shared memory.
__device__ __forceinline__ void load_vector(float* dst, const float* src) {
  *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src);
}
__device__ __forceinline__ void load_vector(float* dst, const __nv_bfloat16* src) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(pairs[q]);
    dst[2 * q] = f.x;
    dst[2 * q + 1] = f.y;
  }
}

// Four adjacent results of one row: one 16-byte (fp32) or 8-byte (bf16) store.
__device__ __forceinline__ void store_four(float* dst, const float (&v)[kMicro]) {
  *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store_four(__nv_bfloat16* dst, const float (&v)[kMicro]) {
  __nv_bfloat162 pairs[2] = {__floats2bfloat162_rn(v[0], v[1]), __floats2bfloat162_rn(v[2], v[3])};
  *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(pairs);
}

template <typename T, bool kFromLatent>
__device__ void accumulate_tile(Tile& acc, const T* __restrict__ hidden, int64_t tokens,
                                int64_t token0, const float* latent, int64_t latent_stride,
                                mla::WeightColumns<T> weights, int64_t depth, int64_t columns,
                                int64_t n0, float* a_tile, float* b_tile) {
  constexpr int V = kVector<T>;
  const int row_group = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t k0 = 0; k0 < depth; k0 += kDepth) {
    if (!kFromLatent) {
      for (int e = threadIdx.x; e < kTokens * kDepth / V; e += kThreads) {
        const int m = e / (kDepth / V), kk = e % (kDepth / V) * V;
        const int64_t token = token0 + m, k = k0 + kk;
        float* dst = a_tile + m * kDepth + kk;
        const T* src = hidden + token * depth + k;
        if (token < tokens && k + V <= depth && aligned(src, 16)) {
          load_vector(dst, src);
        } else {
          for (int q = 0; q < V; ++q) {
            dst[q] = token < tokens && k + q < depth ? mla::to_float(src[q]) : 0.0f;
          }
        }
      }
    }
    for (int e = threadIdx.x; e < kDepth * kColumns / V; e += kThreads) {
      const int kk = e / (kColumns / V), n = e % (kColumns / V) * V;
      const int64_t k = k0 + kk, column = n0 + n;
      float* dst = b_tile + kk * kColumns + n;
      const bool one_part = column >= weights.split || column + V <= weights.split;
      if (k < depth && column + V <= columns && one_part && aligned(weights.at(k, column), 16)) {
        load_vector(dst, weights.at(k, column));
      } else {
        for (int q = 0; q < V; ++q) {
          dst[q] = k < depth && column + q < columns ? mla::to_float(*weights.at(k, column + q))
                                                     : 0.0f;
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDepth; kk += 4) {
      float4 a[kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i) {
        const int row = row_group * kMicro + i;
        a[i] = *reinterpret_cast<const float4*>(
            kFromLatent ? latent + row * latent_stride + k0 + kk : a_tile + row * kDepth + kk);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 b = *reinterpret_cast<const float4*>(b_tile + (kk + q) * kColumns + lane * 4);
#pragma unroll
        for (int i = 0; i < kMicro; ++i) {
          const float a_iq = q == 0 ? a[i].x : q == 1 ? a[i].y : q == 2 ? a[i].z : a[i].w;
          acc[i][0] += a_iq * b.x;
          acc[i][1] += a_iq * b.y;
          acc[i][2] += a_iq * b.z;
          acc[i][3] += a_iq * b.w;
        }
      }
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    vectorized_kernel(const T* __restrict__ hidden, const T* __restrict__ w_down,
                      const T* __restrict__ w_up_k, const T* __restrict__ w_up_v,
                      T* __restrict__ out, int64_t tokens, int64_t d_model, int64_t rank,
                      int64_t width) {
  extern __shared__ float4 shared_vectors[];  // float4 so every row below is 16-byte aligned
  float* latent = reinterpret_cast<float*>(shared_vectors);
  const int64_t latent_stride = mla::round_up(rank, kColumns);
  float* a_tile = latent + kTokens * latent_stride;  // kTokens x kDepth, token-major
  float* b_tile = a_tile + kTokens * kDepth;         // kDepth x kColumns
  const int64_t token0 = int64_t(blockIdx.x) * kTokens;
  const int row_group = threadIdx.x / 32, lane = threadIdx.x % 32;

  const mla::WeightColumns<T> down{w_down, w_down, rank, rank};
  for (int64_t n0 = 0; n0 < latent_stride; n0 += kColumns) {
    Tile acc = {};
    accumulate_tile<T, false>(acc, hidden, tokens, token0, nullptr, 0, down, d_model, rank, n0,
                              a_tile, b_tile);
    for (int i = 0; i < kMicro; ++i) {
      store_four(latent + (row_group * kMicro + i) * latent_stride + n0 + lane * 4, acc[i]);
    }
  }
  __syncthreads();

  const mla::WeightColumns<T> up{w_up_k, w_up_v, width, width};
  const int64_t columns = 2 * width;
  for (int64_t n0 = blockIdx.y * int64_t(kColumns); n0 < columns; n0 += gridDim.y * int64_t(kColumns)) {
    Tile acc = {};
    accumulate_tile<T, true>(acc, hidden, tokens, token0, latent, latent_stride, up, rank,
                             columns, n0, a_tile, b_tile);
    for (int i = 0; i < kMicro; ++i) {
      const int64_t token = token0 + row_group * kMicro + i, column = n0 + lane * 4;
      if (token >= tokens) continue;
      T* dst = out + token * columns + column;
      if (column + kMicro <= columns && aligned(dst, kMicro * sizeof(T))) {
        store_four(dst, acc[i]);
      } else {
        for (int j = 0; j < kMicro && column + j < columns; ++j) dst[j] = mla::from_float<T>(acc[i][j]);
      }
    }
  }
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
  const int64_t latent_stride = mla::round_up(p.rank, kColumns);
  const size_t shared_bytes =
      sizeof(float) * (kTokens * latent_stride + kDepth * (kTokens + kColumns));
  const cudaError_t err = mla::allow_shared_memory(vectorized_kernel<T>, shared_bytes);
  if (err != cudaSuccess) return err;
  const int64_t width = p.heads * p.head_dim;
  const int64_t token_tiles = mla::ceil_div(p.tokens, kTokens);
  const int splits = mla::choose_column_splits(token_tiles, mla::ceil_div(2 * width, kColumns),
                                               double(p.d_model) * double(latent_stride),
                                               double(p.rank) * kColumns);
  const dim3 grid{unsigned(token_tiles), unsigned(splits)};
  vectorized_kernel<T><<<grid, kThreads, shared_bytes, stream>>>(
      static_cast<const T*>(p.hidden), static_cast<const T*>(p.w_down),
      static_cast<const T*>(p.w_up_k), static_cast<const T*>(p.w_up_v), static_cast<T*>(p.out),
      p.tokens, p.d_model, p.rank, width);
  return cudaGetLastError();
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)
