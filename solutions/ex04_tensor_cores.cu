// Step 5 — tensor cores: both GEMMs on mma.sync, the latent tile as the second GEMM's A operand.
//
// Step 4 does every multiply-add on the FP32 pipes (51 TFLOP/s measured on the H200 in notebook
// 01); its tensor cores did bf16 at 677 and TF32 (fp32 inputs rounded to a 10-bit mantissa) at
// about 360. What changed:
// - Each warp computes a 32 x 32 (or 16 x 16) block of results with mma.sync: m16n8k16 for bf16,
//   m16n8k8 for TF32. Operands come from shared memory; bf16 ones through ldmatrix (.trans for B,
//   whose rows are k). Rows are padded by 16 or 32 bytes so these reads hit 32 distinct banks.
// - Slices 128 bytes deep arrive by cp.async into a ring of as many buffers as the GPU's shared
//   memory holds beside the latent tile (2 to 8; 6 for V2-Lite on an H200): while the tensor cores
//   work on one slice, the next ones are already in flight, and one barrier per slice suffices.
//   Tails, misaligned views and runs across the k|v boundary are staged by ordinary loads
//   instead (zeros past the edges), so every shape stays correct.
// - The latent tile is stored once in shared memory (bf16 for bf16 inputs, rounded as eager
//   rounds its latent; fp32 for fp32) and GEMM 2 reads its A fragments straight from there.
// - The epilogue stages each output tile in shared memory, then writes whole 16-byte runs of the
//   stacked (B, S, 2, H, hd) rows, a warp covering contiguous memory.
// - Parallelism: a big tile (64 tokens) uses each weight slice 64 times but leaves a V2-Lite
//   batch of 4096 tokens with only 64 token tiles for 132 SMs; the output columns are split
//   over blocks (mla::choose_column_splits: each split recomputes GEMM 1, about 1/3 of the work
//   at V2-Lite), and small batches use a 16 x 64 tile so the toy gets 96 blocks.
//
// fp32 inputs run in TF32 (unit roundoff 2^-11 instead of 2^-24): mla_lab.check holds this step
// to 2e-3 on fp32 inputs instead of 1e-5. Launch limit: rank <= 512 (the latent tile and
// two stages must fit the 99 KB per block that Ada offers; there, only with the small tile).
#include <stdint.h>

#include "mla_common.cuh"

namespace {

// The tensor-core instruction for each input type, and how its fragments are read from shared
// memory (row-major tiles, `stride` elements per row). Lane l holds parts of rows l / 4 and
// l / 4 + 8 (PTX ISA, "Matrix fragments for mma.m16n8k16" and "... m16n8k8").
template <typename T>
struct TensorCore;

template <>
struct TensorCore<__nv_bfloat16> {
  static constexpr int kDepth = 16;  // k of one mma
  static constexpr int kPadA = 8;    // row padding in elements of A-side tiles (16 bytes)
  static constexpr int kPadB = 8;

  // A: the 16 x 16 tile at `tile`.
  __device__ static void load_a(uint32_t (&a)[4], const __nv_bfloat16* tile, int stride) {
    const int lane = threadIdx.x % 32;
    const __nv_bfloat16* row = tile + (lane % 16) * stride + (lane / 16) * 8;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(mla::shared_address(row)));
  }
  // B: two 8-wide column tiles of the 16 x 16 tile at `tile` (rows are k, so transpose).
  __device__ static void load_b_pair(uint32_t (&b0)[2], uint32_t (&b1)[2],
                                     const __nv_bfloat16* tile, int stride) {
    const int lane = threadIdx.x % 32;
    const __nv_bfloat16* row = tile + (lane % 16) * stride + (lane / 16) * 8;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(b0[0]), "=r"(b0[1]), "=r"(b1[0]), "=r"(b1[1])
                 : "r"(mla::shared_address(row)));
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <>
struct TensorCore<float> {  // fp32 inputs, TF32 math
  static constexpr int kDepth = 8;
  static constexpr int kPadA = 4;  // row stride = 4 (mod 32) words: lanes (4 * row + col) differ
  static constexpr int kPadB = 8;  // row stride = 8 (mod 32) words: lanes (8 * k + column) differ

  __device__ static uint32_t tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
  }
  __device__ static void load_a(uint32_t (&a)[4], const float* tile, int stride) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    a[0] = tf32(tile[g * stride + t]);
    a[1] = tf32(tile[(g + 8) * stride + t]);
    a[2] = tf32(tile[g * stride + t + 4]);
    a[3] = tf32(tile[(g + 8) * stride + t + 4]);
  }
  __device__ static void load_b_pair(uint32_t (&b0)[2], uint32_t (&b1)[2], const float* tile,
                                     int stride) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    b0[0] = tf32(tile[t * stride + g]);
    b0[1] = tf32(tile[(t + 4) * stride + g]);
    b1[0] = tf32(tile[t * stride + 8 + g]);
    b1[1] = tf32(tile[(t + 4) * stride + 8 + g]);
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// A block of kWarpsM x kWarpsN warps owns kTokens tokens and kColumns columns at a time.
template <typename T, int kTokens_, int kColumns_, int kWarpsM, int kWarpsN>
struct Config {
  using Core = TensorCore<T>;
  static constexpr int kTokens = kTokens_, kColumns = kColumns_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kSlice = 128 / sizeof(T);  // depth of one staged slice: 128 bytes per row
  static constexpr int kWarpRows = kTokens / kWarpsM, kWarpColumns = kColumns / kWarpsN;
  static constexpr int kTilesM = kWarpRows / 16, kTilesN = kWarpColumns / 8;
  static constexpr int kVector = 16 / sizeof(T);
  static constexpr int kStrideA = kSlice + Core::kPadA;
  static constexpr int kStrideB = kColumns + Core::kPadB;
  static constexpr int kMinStages = 2, kMaxStages = 8;
  static_assert(kTilesN % 2 == 0, "B fragments are loaded in pairs of 8-wide tiles");
  static_assert(kTokens <= kMinStages * kSlice, "the output tile reuses the B stages");

  __host__ __device__ static int64_t latent_columns(int64_t rank) { return mla::round_up(rank, kColumns); }
  static size_t latent_bytes(int64_t rank) { return sizeof(T) * size_t(kTokens * (latent_columns(rank) + Core::kPadA)); }
  static size_t stage_bytes() { return sizeof(T) * size_t(kTokens * kStrideA + kSlice * kStrideB); }
  static size_t shared_bytes(int64_t rank, int stages) { return latent_bytes(rank) + stages * stage_bytes(); }
  // As many stages as this GPU's shared memory holds beside the latent tile (Ada: 2 at rank 512;
  // A100 and H100: more), or 0 if not even kMinStages fit.
  static int stages_that_fit(int64_t rank) {
    int device = 0, limit = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
      return 0;
    }
    const int64_t room = int64_t(limit) - int64_t(latent_bytes(rank));
    const int64_t stages = room < 0 ? 0 : room / int64_t(stage_bytes());
    return stages < kMinStages ? 0 : int(stages < kMaxStages ? stages : kMaxStages);
  }
};

template <typename T>
struct Problem {
  const T* hidden;
  mla::WeightColumns<T> down, up;
  T* out;
  int64_t tokens, d_model, rank, columns;  // columns = 2 * width
};

// Copies a rows x columns block into shared memory: 16-byte cp.async where a run is whole and
// aligned, ordinary loads (0 past the edges) where not. `source(r, c)` gives the element
// address, `inside(r, c, n)` whether elements c .. c + n - 1 of row r exist and are contiguous.
template <class C, int kRows, int kWidth, typename T, class Source, class Inside>
__device__ __forceinline__ void stage(T* dst, int stride, Source source, Inside inside) {
  for (int e = threadIdx.x; e < kRows * kWidth / C::kVector; e += C::kThreads) {
    const int r = e / (kWidth / C::kVector), c = e % (kWidth / C::kVector) * C::kVector;
    T* to = dst + r * stride + c;
    if (inside(r, c, C::kVector) && mla::aligned16(source(r, c))) {
      mla::copy_async_16(to, source(r, c));
    } else {
      for (int q = 0; q < C::kVector; ++q) {
        to[q] = inside(r, c + q, 1) ? *source(r, c + q) : mla::from_float<T>(0.0f);
      }
    }
  }
}

// acc += A @ B over `depth`, for this block's kTokens x kColumns tile at output column n0.
// A is the hidden tile (GEMM 1) or the latent tile in shared memory (GEMM 2, kFromLatent).
template <class C, bool kFromLatent, typename T>
__device__ void accumulate_tile(float (&acc)[C::kTilesM][C::kTilesN][4], const Problem<T>& p,
                                int64_t token0, int64_t n0, const T* latent, int latent_stride,
                                T* a_stages, T* b_stages, int stages) {
  using Core = typename C::Core;
  const mla::WeightColumns<T> weights = kFromLatent ? p.up : p.down;
  const int64_t depth = kFromLatent ? p.rank : p.d_model;
  const int64_t columns = kFromLatent ? p.columns : p.rank;
  const int warp = threadIdx.x / 32;
  const int warp_row = warp / (C::kColumns / C::kWarpColumns) * C::kWarpRows;
  const int warp_column = warp % (C::kColumns / C::kWarpColumns) * C::kWarpColumns;

  auto stage_slice = [&](int64_t k0, int buffer) {
    if (!kFromLatent) {
      stage<C, C::kTokens, C::kSlice>(
          a_stages + buffer * C::kTokens * C::kStrideA, C::kStrideA,
          [&](int r, int c) { return p.hidden + (token0 + r) * depth + k0 + c; },
          [&](int r, int c, int n) { return token0 + r < p.tokens && k0 + c + n <= depth; });
    }
    stage<C, C::kSlice, C::kColumns>(
        b_stages + buffer * C::kSlice * C::kStrideB, C::kStrideB,
        [&](int r, int c) { return weights.at(k0 + r, n0 + c); },
        [&](int r, int c, int n) {
          const int64_t column = n0 + c;
          const bool one_part = column >= weights.split || column + n <= weights.split;
          return k0 + r < depth && column + n <= columns && one_part;
        });
    mla::commit_copies();
  };

  // A ring of `stages` buffers: slices s + 1 .. s + stages - 1 are in flight while slice s is
  // multiplied. Every iteration commits one group (empty past the last slice), so "all but the
  // newest stages - 2 groups are done" always means "slice s has landed".
  const int64_t slices = mla::ceil_div(depth, C::kSlice);
  for (int i = 0; i < stages - 1; ++i) {
    if (i < slices) {
      stage_slice(i * C::kSlice, i);
    } else {
      mla::commit_copies();
    }
  }
  for (int64_t s = 0; s < slices; ++s) {
    mla::wait_for_copies(stages - 2);
    // Slice s, from every thread's copies, is in shared memory, and every warp is done with
    // slice s - 1, whose buffer is refilled next.
    __syncthreads();
    const int64_t next = s + stages - 1;
    if (next < slices) {
      stage_slice(next * C::kSlice, int(next % stages));
    } else {
      mla::commit_copies();
    }
    const int buffer = int(s % stages);
    const T* a_tile = kFromLatent ? latent + s * C::kSlice : a_stages + buffer * C::kTokens * C::kStrideA;
    const int a_stride = kFromLatent ? latent_stride : C::kStrideA;
    const T* b_tile = b_stages + buffer * C::kSlice * C::kStrideB;
#pragma unroll
    for (int ks = 0; ks < C::kSlice; ks += Core::kDepth) {
      uint32_t a[C::kTilesM][4], b[C::kTilesN][2];
#pragma unroll
      for (int tm = 0; tm < C::kTilesM; ++tm) {
        Core::load_a(a[tm], a_tile + (warp_row + tm * 16) * a_stride + ks, a_stride);
      }
#pragma unroll
      for (int tn = 0; tn < C::kTilesN; tn += 2) {
        Core::load_b_pair(b[tn], b[tn + 1], b_tile + ks * C::kStrideB + warp_column + tn * 8,
                          C::kStrideB);
      }
#pragma unroll
      for (int tm = 0; tm < C::kTilesM; ++tm) {
#pragma unroll
        for (int tn = 0; tn < C::kTilesN; ++tn) Core::mma(acc[tm][tn], a[tm], b[tn]);
      }
    }
  }
  __syncthreads();  // every warp is done with the buffers before the next tile refills them
}

// Two adjacent results of one row, rounded to T: into shared memory.
__device__ __forceinline__ void store_pair(float* dst, float x, float y) {
  *reinterpret_cast<float2*>(dst) = make_float2(x, y);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* dst, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
}

// Calls f(row, column, x, y) for this thread's result pairs (the mma accumulator layout).
template <class C, class F>
__device__ __forceinline__ void for_each_pair(const float (&acc)[C::kTilesM][C::kTilesN][4], F f) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row = warp / (C::kColumns / C::kWarpColumns) * C::kWarpRows;
  const int warp_column = warp % (C::kColumns / C::kWarpColumns) * C::kWarpColumns;
#pragma unroll
  for (int tm = 0; tm < C::kTilesM; ++tm) {
#pragma unroll
    for (int tn = 0; tn < C::kTilesN; ++tn) {
      const int row = warp_row + tm * 16 + lane / 4, column = warp_column + tn * 8 + lane % 4 * 2;
      f(row, column, acc[tm][tn][0], acc[tm][tn][1]);
      f(row + 8, column, acc[tm][tn][2], acc[tm][tn][3]);
    }
  }
}

template <class C, typename T>
__global__ void __launch_bounds__(C::kThreads, 1) tensor_core_kernel(Problem<T> p, int stages) {
  extern __shared__ float4 shared_vectors[];  // float4: every region below starts 16-byte aligned
  T* latent = reinterpret_cast<T*>(shared_vectors);
  const int latent_stride = int(C::latent_columns(p.rank)) + C::Core::kPadA;
  T* a_stages = latent + C::kTokens * latent_stride;
  T* b_stages = a_stages + stages * C::kTokens * C::kStrideA;
  const int64_t token0 = int64_t(blockIdx.x) * C::kTokens;

  // GEMM 1 into the latent tile, kColumns latent columns at a time (columns past rank are 0).
  for (int64_t n0 = 0; n0 < C::latent_columns(p.rank); n0 += C::kColumns) {
    float acc[C::kTilesM][C::kTilesN][4] = {};
    accumulate_tile<C, false>(acc, p, token0, n0, latent, latent_stride, a_stages, b_stages, stages);
    for_each_pair<C>(acc, [&](int row, int column, float x, float y) {
      store_pair(latent + row * latent_stride + n0 + column, x, y);
    });
  }
  __syncthreads();  // the latent tile is complete before GEMM 2 reads it

  // GEMM 2: this block's output column tiles (blockIdx.y, every gridDim.y-th).
  for (int64_t n0 = blockIdx.y * int64_t(C::kColumns); n0 < p.columns;
       n0 += gridDim.y * int64_t(C::kColumns)) {
    float acc[C::kTilesM][C::kTilesN][4] = {};
    accumulate_tile<C, true>(acc, p, token0, n0, latent, latent_stride, a_stages, b_stages, stages);
    T* out_tile = b_stages;  // kTokens x kStrideB; the B stages are free after the last slice
    // BEGIN SOLUTION: write the stacked output tile: put each result pair (for_each_pair, store_pair) into out_tile, wait for the whole block, then copy out_tile to p.out row by row in 16-byte runs (C::kVector elements) where the run is inside the output and aligned, element by element where not; wait again before out_tile is reused
    for_each_pair<C>(acc, [&](int row, int column, float x, float y) {
      store_pair(out_tile + row * C::kStrideB + column, x, y);
    });
    __syncthreads();  // every result is in out_tile before any thread copies a row of it out
    for (int e = threadIdx.x; e < C::kTokens * C::kColumns / C::kVector; e += C::kThreads) {
      const int row = e / (C::kColumns / C::kVector);
      const int column = e % (C::kColumns / C::kVector) * C::kVector;
      const int64_t token = token0 + row;
      if (token >= p.tokens) continue;
      const T* from = out_tile + row * C::kStrideB + column;
      T* to = p.out + token * p.columns + n0 + column;
      if (n0 + column + C::kVector <= p.columns && mla::aligned16(to)) {
        *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
      } else {
        for (int q = 0; q < C::kVector && n0 + column + q < p.columns; ++q) to[q] = from[q];
      }
    }
    __syncthreads();  // out_tile is read out before the next tile's slices overwrite it
    // END SOLUTION
  }
}

template <class C, typename T>
cudaError_t launch_config(const Problem<T>& p, cudaStream_t stream) {
  const int stages = C::stages_that_fit(p.rank);
  if (stages == 0) return cudaErrorInvalidValue;
  const size_t shared_bytes = C::shared_bytes(p.rank, stages);
  const cudaError_t err = mla::allow_shared_memory(tensor_core_kernel<C, T>, shared_bytes);
  if (err != cudaSuccess) return err;
  const int64_t token_tiles = mla::ceil_div(p.tokens, C::kTokens);
  const int splits = mla::choose_column_splits(
      token_tiles, mla::ceil_div(p.columns, C::kColumns),
      double(p.d_model) * double(C::latent_columns(p.rank)), double(p.rank) * C::kColumns);
  tensor_core_kernel<C, T><<<dim3(unsigned(token_tiles), unsigned(splits)), C::kThreads,
                             shared_bytes, stream>>>(p, stages);
  return cudaGetLastError();
}

template <typename T>
using LargeTile = Config<T, sizeof(T) == 2 ? 64 : 32, 128, sizeof(T) == 2 ? 2 : 1, 4>;
template <typename T>
using SmallTile = Config<T, 16, 64, 1, 4>;

template <typename T>
cudaError_t launch(const MlaProblem& raw, cudaStream_t stream) {
  const int64_t width = raw.heads * raw.head_dim;
  const T* w_down = static_cast<const T*>(raw.w_down);
  const Problem<T> p{static_cast<const T*>(raw.hidden),
                     {w_down, w_down, raw.rank, raw.rank},
                     {static_cast<const T*>(raw.w_up_k), static_cast<const T*>(raw.w_up_v), width, width},
                     static_cast<T*>(raw.out),
                     raw.tokens, raw.d_model, raw.rank, 2 * width};
  // The big tile only when, split to the full, it still gives every SM a block, and when this
  // GPU's shared memory holds its latent tile beside two stages (not on Ada at rank 512).
  const int64_t big_tile_blocks = mla::ceil_div(p.tokens, LargeTile<T>::kTokens) *
                                  mla::ceil_div(p.columns, LargeTile<T>::kColumns);
  if (big_tile_blocks >= mla::multiprocessor_count() && LargeTile<T>::stages_that_fit(p.rank) > 0) {
    return launch_config<LargeTile<T>>(p, stream);
  }
  return launch_config<SmallTile<T>>(p, stream);
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)
