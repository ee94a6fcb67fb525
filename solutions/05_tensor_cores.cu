// Step 5 — tensor cores: both GEMMs on mma.sync, the latent tile as the second GEMM's A operand.
//
// What changed from step 4, and why: step 4 does every multiply-add on the FP32 pipes, while the
// tensor cores do bf16 about 13x and TF32 about 7x faster.
// - Each warp computes its block of results with mma.sync (m16n8k16 bf16, m16n8k8 TF32); bf16
//   operands come through ldmatrix, rows padded so the reads hit distinct banks.
// - 128-byte-deep slices arrive by cp.async into a ring of as many buffers as fit beside the
//   latent tile; each thread's copies are planned once per tile (`Runs`).
// - The latent tile stays in shared memory (bf16, or fp32) and is GEMM 2's A operand.
// - The epilogue stages each output tile in shared memory and writes whole 16-byte runs.
// - Tiles of 64 x 256 (16 warps), 32 x 128 or 16 x 64, the largest that gives every SM a block.
// fp32 inputs run in TF32: held to 2e-3 instead of 1e-5. Launch limit: rank <= 512 (Ada's 99 KB).
// Measurements and the variants not kept: kernels/05_tensor_cores.md.
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
    // BEGIN SOLUTION: one mla::ldmatrix_x4 loads the whole A fragment; each lane hands it the address of one 8-element row (16 bytes) of the 16 x 16 tile. The four 8 x 8 matrices it returns must come in mma's order a0..a3: rows 0-7 then 8-15 of columns 0-7, then the same rows of columns 8-15; lane i gives row i of those 32 (rows are `stride` elements apart)
    // HINT 1: ldmatrix.x4 is four 8 x 8 matrices in one instruction: each lane supplies one row address, and lane i's row ends up split across the fragment registers the mma expects.
    // HINT 2: lane = threadIdx.x % 32; lanes 0-15 give rows 0-15 of columns 0-7, lanes 16-31 rows 0-15 of columns 8-15: row pointer = tile + (lane % 16) * stride + (lane / 16) * 8; ldmatrix_x4(a, row).
    const int lane = threadIdx.x % 32;
    const __nv_bfloat16* row = tile + (lane % 16) * stride + (lane / 16) * 8;
    mla::ldmatrix_x4(a, row);
    // END SOLUTION
  }
  // B: two 8-wide column tiles of the 16 x 16 tile at `tile` (rows are k, so transpose).
  __device__ static void load_b_pair(uint32_t (&b0)[2], uint32_t (&b1)[2],
                                     const __nv_bfloat16* tile, int stride) {
    const int lane = threadIdx.x % 32;
    const __nv_bfloat16* row = tile + (lane % 16) * stride + (lane / 16) * 8;
    uint32_t both[4];
    mla::ldmatrix_x4_trans(both, row);
    b0[0] = both[0], b0[1] = both[1], b1[0] = both[2], b1[1] = both[3];
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mla::mma_bf16(c, a, b[0], b[1]);
  }
};

template <>
struct TensorCore<float> {  // fp32 inputs, TF32 math
  static constexpr int kDepth = 8;
  static constexpr int kPadA = 4;  // row stride = 4 (mod 32) words: lanes (4 * row + col) differ
  static constexpr int kPadB = 8;  // row stride = 8 (mod 32) words: lanes (8 * k + column) differ

  __device__ static void load_a(uint32_t (&a)[4], const float* tile, int stride) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    a[0] = mla::round_to_tf32(tile[g * stride + t]);
    a[1] = mla::round_to_tf32(tile[(g + 8) * stride + t]);
    a[2] = mla::round_to_tf32(tile[g * stride + t + 4]);
    a[3] = mla::round_to_tf32(tile[(g + 8) * stride + t + 4]);
  }
  __device__ static void load_b_pair(uint32_t (&b0)[2], uint32_t (&b1)[2], const float* tile,
                                     int stride) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    b0[0] = mla::round_to_tf32(tile[t * stride + g]);
    b0[1] = mla::round_to_tf32(tile[(t + 4) * stride + g]);
    b1[0] = mla::round_to_tf32(tile[t * stride + 8 + g]);
    b1[1] = mla::round_to_tf32(tile[(t + 4) * stride + 8 + g]);
  }
  __device__ static void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mla::mma_tf32(c, a, b[0], b[1]);
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

// A thread's 16-byte runs of one staged slice (kRows x kWidth elements, row-major): run i starts
// at row `row0() + i * kRowsApart`, element `column()`. Moving kRowsApart rows on, or on to the
// next slice (kSlice elements of A's row: 128 bytes; kSlice rows of B), keeps a run's 16-byte
// alignment, so whether it can go by cp.async is worked out once per tile, not once per copy.
template <class C, int kRows, int kWidth>
struct Runs {
  static constexpr int kPerRow = kWidth / C::kVector;
  static constexpr int kRowsApart = C::kThreads / kPerRow;
  static constexpr int kCount = kRows / kRowsApart;
  static_assert(C::kThreads % kPerRow == 0 && kRows % kRowsApart == 0, "a slice is whole runs, evenly shared");
  static_assert(kRowsApart % C::kVector == 0, "kRowsApart rows of any row length are a multiple of 16 bytes");
  __device__ static int row0() { return threadIdx.x / kPerRow; }
  __device__ static int column() { return threadIdx.x % kPerRow * C::kVector; }
};

// acc += A @ B over `depth`, for this block's kTokens x kColumns tile at output column n0.
// A is the hidden tile (GEMM 1) or the latent tile in shared memory (GEMM 2, kFromLatent).
template <class C, bool kFromLatent, typename T>
__device__ void accumulate_tile(float (&acc)[C::kTilesM][C::kTilesN][4], const mla::Problem<T>& p,
                                int64_t token0, int64_t n0, const T* latent, int latent_stride,
                                T* a_stages, T* b_stages, int stages) {
  using Core = typename C::Core;
  using RunsA = Runs<C, C::kTokens, C::kSlice>;
  using RunsB = Runs<C, C::kSlice, C::kColumns>;
  constexpr int kStageA = C::kTokens * C::kStrideA, kStageB = C::kSlice * C::kStrideB;  // elements
  const mla::WeightColumns<T> weights = kFromLatent ? p.up : p.down;
  const int64_t depth = kFromLatent ? p.rank : p.d_model;
  const int64_t columns = kFromLatent ? p.columns : p.rank;
  const int warp = threadIdx.x / 32;
  const int warp_row = warp / (C::kColumns / C::kWarpColumns) * C::kWarpRows;
  const int warp_column = warp % (C::kColumns / C::kWarpColumns) * C::kWarpColumns;

  // This thread's runs, planned once per tile. A run is `direct` (one cp.async) when it is
  // aligned and inside the matrix, depth aside: only the last slice can pass the depth, and
  // there every run takes the element path, which writes 0 past the edges.
  const int a_row = RunsA::row0(), a_column = RunsA::column();
  const T* a_from = p.hidden + (token0 + a_row) * p.d_model + a_column;
  const uint32_t a_to = mla::shared_address(a_stages + a_row * C::kStrideA + a_column);
  unsigned a_direct = 0;  // bit i: run i
#pragma unroll
  for (int i = 0; i < RunsA::kCount; ++i) {
    a_direct |= unsigned(!kFromLatent && token0 + a_row + i * RunsA::kRowsApart < p.tokens && mla::aligned16(a_from)) << i;
  }
  const int b_row = RunsB::row0();
  const int64_t b_first = n0 + RunsB::column();
  const T* b_from = weights.at(b_row, b_first);
  const uint32_t b_to = mla::shared_address(b_stages + b_row * C::kStrideB + RunsB::column());
  const bool b_direct = b_first + C::kVector <= columns && mla::aligned16(b_from) &&
                        (b_first >= weights.split || b_first + C::kVector <= weights.split);

  const int slices = int(mla::ceil_div(depth, C::kSlice));
  auto stage_slice = [&](int slice, int buffer) {
    const int64_t k0 = int64_t(slice) * C::kSlice;
    const bool whole = k0 + C::kSlice <= depth;
    if constexpr (!kFromLatent) {
#pragma unroll
      for (int i = 0; i < RunsA::kCount; ++i) {
        const int row = a_row + i * RunsA::kRowsApart;
        if (whole && (a_direct >> i & 1)) {
          mla::copy_async_16(a_to + uint32_t(sizeof(T) * (buffer * kStageA + i * RunsA::kRowsApart * C::kStrideA)),
                             a_from + k0 + i * RunsA::kRowsApart * p.d_model);
        } else {
          mla::copy_run_by_elements(a_stages + buffer * kStageA + row * C::kStrideA + a_column, [&](int q) -> const T* {
            const int64_t k = k0 + a_column + q;
            return token0 + row < p.tokens && k < depth ? p.hidden + (token0 + row) * depth + k : nullptr;
          });
        }
      }
    }
#pragma unroll
    for (int j = 0; j < RunsB::kCount; ++j) {
      const int row = b_row + j * RunsB::kRowsApart;
      if (whole && b_direct) {
        mla::copy_async_16(b_to + uint32_t(sizeof(T) * (buffer * kStageB + j * RunsB::kRowsApart * C::kStrideB)),
                           b_from + (k0 + j * RunsB::kRowsApart) * weights.ld);
      } else {
        mla::copy_run_by_elements(b_stages + buffer * kStageB + row * C::kStrideB + RunsB::column(), [&](int q) -> const T* {
          const int64_t k = k0 + row, column = b_first + q;
          return k < depth && column < columns ? weights.at(k, column) : nullptr;
        });
      }
    }
  };

  // A ring of `stages` buffers: slices s + 1 .. s + stages - 1 are in flight while slice s is
  // multiplied. Every step commits one group (empty past the last slice), so "all but the
  // newest stages - 2 groups have landed" always means "slice s has landed".
  int fill = 0, drain = 0;  // ring buffers of the next slice to stage and of slice s
  for (int s = 0; s < stages - 1; ++s) {
    if (s < slices) stage_slice(s, fill);
    fill = fill + 1 == stages ? 0 : fill + 1;
    mla::commit_copies();
  }
  for (int s = 0; s < slices; ++s) {
    mla::wait_for_copies(stages - 2);
    // Slice s, from every thread's copies, is in shared memory, and every warp is done with
    // slice s - 1, whose buffer is refilled next.
    __syncthreads();
    if (s + stages - 1 < slices) stage_slice(s + stages - 1, fill);
    fill = fill + 1 == stages ? 0 : fill + 1;
    mla::commit_copies();
    const T* a_tile = kFromLatent ? latent + s * C::kSlice : a_stages + drain * kStageA;
    const int a_stride = kFromLatent ? latent_stride : C::kStrideA;
    const T* b_tile = b_stages + drain * kStageB;
    drain = drain + 1 == stages ? 0 : drain + 1;
#pragma unroll
    for (int ks = 0; ks < C::kSlice; ks += Core::kDepth) {
      // BEGIN SOLUTION: one mma depth (Core::kDepth) of this warp's block of results, (16 * C::kTilesM) rows from warp_row x (8 * C::kTilesN) columns from warp_column: load each of its C::kTilesM A fragments (Core::load_a, rows 16 apart, depth ks.. of a_tile, a_stride apart) and its C::kTilesN B fragments two at a time (Core::load_b_pair, columns 8 apart, rows ks.. of b_tile, C::kStrideB apart), then Core::mma every A fragment with every B fragment into acc[tm][tn]. Load all fragments before the first mma, so the tensor cores get independent work back to back
      // HINT 1: Load every fragment first, then issue the mmas: kTilesM x kTilesN independent mmas back to back keep the tensor cores busy while the loads of the next depth are in flight.
      // HINT 2: uint32_t a[kTilesM][4], b[kTilesN][2]; load_a for each tm at row warp_row + 16 * tm, depth ks; load_b_pair for tn += 2 at column warp_column + 8 * tn, row ks; then mma(acc[tm][tn], a[tm], b[tn]) for every pair.
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
      // END SOLUTION
    }
  }
  __syncthreads();  // every warp is done with the buffers before the next tile refills them
}

// Two adjacent results of one row, rounded to T: into shared memory.
__device__ __forceinline__ void store_pair(float* dst, float x, float y) {
  mla::store_whole<mla::Space::kShared>(dst, make_uint2(__float_as_uint(x), __float_as_uint(y)));
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
__global__ void __launch_bounds__(C::kThreads, 1) tensor_core_kernel(mla::Problem<T> p, int stages) {
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
    // HINT 1: Results leave the registers in mma's scattered layout; staging the tile in shared memory lets the block write the output in whole 16-byte runs along each token's row.
    // HINT 2: for_each_pair -> store_pair into out_tile; __syncthreads(); for each (row, 16-byte column run) of the tile: skip tokens past p.tokens; a whole aligned run as one uint4 store, else element by element up to p.columns; __syncthreads() before out_tile is reused.
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
cudaError_t launch_config(const mla::Problem<T>& p, cudaStream_t stream) {
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

// Tiles from the most reuse of each staged slice to the most blocks.
template <typename T>
using Tile64 = Config<T, 64, 256, 2, 8>;
template <typename T>
using Tile32 = Config<T, 32, 128, 1, 4>;
template <typename T>
using Tile16 = Config<T, 16, 64, 1, 4>;

// Whether tile C suits this launch: split to the full, it still gives every SM a block, and this
// GPU's shared memory holds its latent tile beside two stages (at rank 512, in fp32 the 64-token
// tile needs 213 KiB, more than an A100 has; on Ada only Tile32 in bf16 and Tile16 fit).
template <class C, typename T>
bool suits(const mla::Problem<T>& p) {
  const int64_t blocks = mla::ceil_div(p.tokens, C::kTokens) * mla::ceil_div(p.columns, C::kColumns);
  return blocks >= mla::multiprocessor_count() && C::stages_that_fit(p.rank) > 0;
}

template <typename T>
cudaError_t launch(const MlaProblem& raw, cudaStream_t stream) {
  const mla::Problem<T> p = mla::Problem<T>::of(raw);
  if (suits<Tile64<T>>(p)) return launch_config<Tile64<T>>(p, stream);
  if (suits<Tile32<T>>(p)) return launch_config<Tile32<T>>(p, stream);
  return launch_config<Tile16<T>>(p, stream);
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)
