// Step 4 — vectorized and pipelined: 16-byte copies in flight while the FP32 pipes work.
//
// What changed from step 3, and why: step 3 loads a slice, waits, multiplies, then loads the next,
// so every slice pays a full trip to L2 with nothing in flight, and its loads are scalar.
// - Slices 16 deep arrive by 16-byte cp.async into a double buffer: one is multiplied while the
//   next lands. Misaligned, straddling or tail runs are copied element by element, zero-filled.
// - A thread's runs are planned once per tile, so a copy costs one or two instructions.
// - A thread computes 8 tokens x 4 adjacent columns; a warp's lanes are 4 token groups x 8 column
//   groups, so its shared-memory reads fall in different banks. 16 warps hide each other's waits.
// - Output columns are split over blocks where that fills the GPU (mla::choose_column_splits).
// Launch limit: rank <= 640 (the fp32 latent tile and two slices in Ada's 99 KB per block).
// Measurements and the variants not kept: kernels/04_vectorized.md.
#include <stdint.h>

#include "mla_common.cuh"

namespace {

constexpr int kTokens = 32;
constexpr int kColumns = 512;
constexpr int kThreads = 512;        // 16 warps, each all kTokens x kWarpColumns
constexpr int kWarpColumns = kColumns / (kThreads / 32);
constexpr int kTokenGroups = 4;      // a warp's lanes: kTokenGroups x kColumnGroups
constexpr int kColumnGroups = 8;
constexpr int kRows = kTokens / kTokenGroups;  // a thread's results: kRows tokens x kChunks x 4 columns
constexpr int kChunks = kWarpColumns / (4 * kColumnGroups);
constexpr int kDepth = 16;  // k of one staged slice, halved while two do not fit (down to one run)
constexpr int kBuffers = 2;  // slices in shared memory: one is multiplied while the next lands
template <typename T>
constexpr int kVector = 16 / sizeof(T);  // elements in one 16-byte copy
// A row of a staged slice of the hidden tile: its depth, plus one 16-byte run where the 4 rows a
// warp reads at once would otherwise lie a multiple of 64 bytes apart, on the same banks.
template <typename T, int kSliceDepth>
constexpr int kARow = kSliceDepth * sizeof(T) % 64 == 0 ? kSliceDepth + kVector<T> : kSliceDepth;
template <typename T, int kSliceDepth>
constexpr int kStageElements = kTokens * kARow<T, kSliceDepth> + kSliceDepth * kColumns;  // A, then B

using Tile = float[kRows][kChunks][4];

// This thread's results in a tile: rows row0, row0 + kTokenGroups, ...; columns column + 32 j ..
// column + 32 j + 3 for chunk j; its warp's kWarpColumns start at warp_column. Its rows
// interleave with those of the warp's other token groups, so that the 4 rows a warp reads at
// once lie next to each other in shared memory, in 4 different banks.
struct ThreadTile {
  int row0, column, warp_column;
};
__device__ __forceinline__ ThreadTile thread_tile() {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_column = warp * kWarpColumns;
  return {lane / kColumnGroups, warp_column + lane % kColumnGroups * 4, warp_column};
}
__device__ __forceinline__ int row_of(const ThreadTile& mine, int i) { return mine.row0 + i * kTokenGroups; }
__device__ __forceinline__ int column_of(const ThreadTile& mine, int chunk) {
  return mine.column + chunk * 4 * kColumnGroups;
}

// Four adjacent elements of shared memory as floats: one 16-byte (fp32) or 8-byte (bf16) read.
__device__ __forceinline__ float4 read_four(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 read_four(const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(low.x, low.y, high.x, high.y);
}

// Four adjacent results of one row: one 16-byte (fp32) or 8-byte (bf16) store into kSpace.
template <mla::Space kSpace>
__device__ __forceinline__ void store_four(float* dst, const float (&v)[4]) {
  mla::store_whole<kSpace>(dst, make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                                           __float_as_uint(v[3])));
}
template <mla::Space kSpace>
__device__ __forceinline__ void store_four(__nv_bfloat16* dst, const float (&v)[4]) {
  mla::store_whole<kSpace>(dst, make_uint2(mla::pack_bf16(v[0], v[1]), mla::pack_bf16(v[2], v[3])));
}

// How many depths of its A rows a thread takes per shared-memory read: 4 in bf16, 2 in fp32.
// Reading 2 holds 16 A values in registers across the multiply-adds instead of 32, for twice the
// reads: in fp32 that was 3.5 % faster at V2-Lite 4096 and 8192 tokens, in bf16 1.6 % slower
// (kernels/04_vectorized.md).
template <typename T>
constexpr int kADepths = sizeof(T) == sizeof(float) ? 2 : 4;
template <int kDepths>
__device__ __forceinline__ float4 read_depths(const float* p) {
  if constexpr (kDepths == 4) {
    return read_four(p);
  } else {
    const float2 v = *reinterpret_cast<const float2*>(p);
    return make_float4(v.x, v.y, 0.0f, 0.0f);
  }
}
template <int kDepths>
__device__ __forceinline__ float4 read_depths(const __nv_bfloat16* p) {
  static_assert(kDepths == 4, "bf16 rows are read 4 depths at a time");
  return read_four(p);
}

__device__ __forceinline__ float component(const float4& v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

template <typename T>
struct Problem : mla::Problem<T> {
  int latent_columns;  // rank rounded up to whole slices; those past the rank hold zeros
  int latent_stride;   // a latent row's floats: 4 past a multiple of 32, so that a warp's reads
                       // of 4 consecutive rows fall in different banks
};

// acc += A @ B over `depth` for this block's tile at output column n0. A is the hidden tile
// (GEMM 1) or the latent tile in shared memory (GEMM 2, kFromLatent).
template <typename T, int kSliceDepth, bool kFromLatent>
__device__ void accumulate_tile(Tile& acc, const Problem<T>& p, int64_t token0, int64_t n0,
                                const float* latent, T* ring) {
  // A thread's 16-byte runs, planned once per tile so that a slice costs one cp.async per run.
  // A run is `direct` when it is whole, aligned and inside the matrix (the depth aside, which
  // only the last slice can reach); one that is not is copied element by element. A run keeps
  // its alignment from slice to slice: the next one is kSliceDepth columns (A) or rows (B) on, a
  // multiple of 16 bytes. B's runs of a thread share a column and lie kRowsApart rows apart.
  constexpr int kRunsA = kTokens * kSliceDepth / kVector<T>, kRunsPerRow = kColumns / kVector<T>;
  constexpr int kRowsApart = kThreads / kRunsPerRow, kRunsB = kSliceDepth / kRowsApart;
  static_assert(kThreads % kRunsPerRow == 0 && kSliceDepth % kRowsApart == 0, "B's runs tile the slice");
  static_assert(kSliceDepth % kVector<T> == 0 && kSliceDepth % 4 == 0, "A's runs and reads tile the slice");
  constexpr int kAStride = kARow<T, kSliceDepth>, kBStart = kTokens * kAStride;  // in a stage's elements
  const mla::WeightColumns<T> weights = kFromLatent ? p.up : p.down;
  const int64_t depth = kFromLatent ? p.rank : p.d_model;
  const int64_t columns = kFromLatent ? p.columns : p.rank;
  const ThreadTile mine = thread_tile();
  const bool computes = n0 + mine.warp_column < columns;  // the same for the whole warp
  const uint32_t ring_address = mla::shared_address(ring);

  auto hidden_at = [&](int64_t k0, int r, int c) { return p.hidden + (token0 + r) * depth + k0 + c; };
  constexpr int kRunsPerTokenRow = kSliceDepth / kVector<T>;
  const int a_row = threadIdx.x / kRunsPerTokenRow, a_column = threadIdx.x % kRunsPerTokenRow * kVector<T>;
  const T* a_from = hidden_at(0, a_row, a_column);
  const uint32_t a_to = ring_address + uint32_t(sizeof(T) * (a_row * kAStride + a_column));
  const bool a_direct = !kFromLatent && threadIdx.x < kRunsA && token0 + a_row < p.tokens && mla::aligned16(a_from);

  const int b_row = threadIdx.x / kRunsPerRow, b_column = threadIdx.x % kRunsPerRow * kVector<T>;
  const int64_t first = n0 + b_column;
  const T* b_from = weights.at(b_row, first);
  const uint32_t b_to = ring_address + uint32_t(sizeof(T) * (kBStart + b_row * kColumns + b_column));
  const bool b_inside = first + kVector<T> <= columns && (first >= weights.split || first + kVector<T> <= weights.split);
  unsigned b_direct = 0;  // bit j: run j
#pragma unroll
  for (int j = 0; j < kRunsB; ++j) {
    b_direct |= unsigned(b_inside && mla::aligned16(b_from + j * kRowsApart * weights.ld)) << j;
  }

  // Slice `slice` into ring buffer `buffer`.
  const int slices = int(mla::ceil_div(depth, kSliceDepth));
  auto stage_slice = [&](int slice, int buffer) {
    const bool whole = int64_t(slice + 1) * kSliceDepth <= depth;
    const int64_t k0 = int64_t(slice) * kSliceDepth;
    const uint32_t offset = uint32_t(buffer * kStageElements<T, kSliceDepth> * sizeof(T));
    T* stage = ring + buffer * kStageElements<T, kSliceDepth>;
    if (!kFromLatent && threadIdx.x < kRunsA) {
      if (whole && a_direct) {
        mla::copy_async_16(a_to + offset, a_from + k0);
      } else {
        mla::copy_run_by_elements(stage + a_row * kAStride + a_column, [&](int q) -> const T* {
          return token0 + a_row < p.tokens && k0 + a_column + q < depth ? hidden_at(k0, a_row, a_column + q) : nullptr;
        });
      }
    }
    // BEGIN SOLUTION: stage this thread's kRunsB runs of the weight slice: run j is row b_row + j * kRowsApart of the slice (weights row k0 + that row, columns first ..), landing kColumns elements per row further into the B part of the stage. A run that is whole and 16-byte aligned (`whole`, bit j of b_direct) goes by one mla::copy_async_16 to shared address b_to + offset + its row's byte offset; any other run goes element by element (mla::copy_run_by_elements into stage + kBStart + row * kColumns + b_column), nullptr past the matrix's edges so it is zero-filled
    // HINT 1: A run that is whole and 16-byte aligned goes by one cp.async of 16 bytes; anything else (tails, misaligned views, the k | v boundary) goes element by element with zeros past the edges.
    // HINT 2: for j < kRunsB: if (whole && bit j of b_direct) copy_async_16(shared address of run j, global address of run j); else copy_run_by_elements(shared run j, [&](q) { return the q-th element's address, or nullptr past depth or columns; }).
#pragma unroll
    for (int j = 0; j < kRunsB; ++j) {
      if (whole && (b_direct >> j & 1)) {
        mla::copy_async_16(b_to + offset + uint32_t(sizeof(T) * j * kRowsApart * kColumns),
                           b_from + (k0 + j * kRowsApart) * weights.ld);
      } else {
        const int row = b_row + j * kRowsApart;
        mla::copy_run_by_elements(stage + kBStart + row * kColumns + b_column, [&](int q) -> const T* {
          return k0 + row < depth && first + q < columns ? weights.at(k0 + row, first + q) : nullptr;
        });
      }
    }
    // END SOLUTION
  };

  // A double buffer, so "slice s has landed" is "all this thread's copies have": a wait whose
  // count is a constant, as the instruction needs. (A ring of 2 to 4 slices, its depth chosen at
  // run time, waited through a jump table on that depth and was 3 % slower.)
  static_assert(kBuffers == 2, "slice s + 1 goes to the other buffer, and slice s is all that is in flight");
  int current = 0;  // the buffer of slice s
  // BEGIN SOLUTION: before the loop, put slice 0's copies in flight into buffer `current` (if there is a slice) and close them as one group of copies
  // HINT 1: Nothing is in flight yet: the first slice must be, before the loop's first wait.
  // HINT 2: if there is a slice, stage_slice(0, current); then close the group with commit_copies(), also when there is none (every iteration waits for a group).
  if (slices > 0) stage_slice(0, current);
  mla::commit_copies();
  // END SOLUTION
  for (int s = 0; s < slices; ++s) {
    // BEGIN SOLUTION: keep one slice in flight while one is multiplied. Invariant at the top of iteration s: slice s's copies are the only group in flight, in buffer `current`. Wait until this thread's copies have landed, make every thread's visible (and every warp done with slice s - 1, whose buffer is refilled next), then start slice s + 1 into the other buffer and close its group
    // HINT 1: Double buffering: wait for your copies of slice s, a barrier makes everyone's visible and frees the buffer of slice s - 1, then start slice s + 1 into that buffer.
    // HINT 2: wait_for_copies(0); __syncthreads(); if (s + 1 < slices) stage_slice(s + 1, current ^ 1); commit_copies();
    mla::wait_for_copies(0);
    // Slice s is in from every thread, and every warp is done with slice s - 1, whose buffer
    // the next copies refill.
    __syncthreads();
    if (s + 1 < slices) stage_slice(s + 1, current ^ 1);
    mla::commit_copies();
    // END SOLUTION
    const T* a_stage = ring + current * kStageElements<T, kSliceDepth>;
    current ^= 1;
    if (!computes) continue;
    const T* b = a_stage + kBStart + mine.column;
    constexpr int kRead = kADepths<T>;
#pragma unroll
    for (int kk = 0; kk < kSliceDepth; kk += kRead) {
      float4 a[kRows];  // a[i]: depths kk .. kk + kRead - 1 of row i
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if constexpr (kFromLatent) {
          a[i] = read_depths<kRead>(latent + row_of(mine, i) * p.latent_stride + s * kSliceDepth + kk);
        } else {
          a[i] = read_depths<kRead>(a_stage + row_of(mine, i) * kAStride + kk);
        }
      }
#pragma unroll
      for (int q = 0; q < kRead; ++q) {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          const float4 bq = read_four(b + (kk + q) * kColumns + j * 4 * kColumnGroups);
#pragma unroll
          for (int i = 0; i < kRows; ++i) {
            const float a_iq = component(a[i], q);
            acc[i][j][0] += a_iq * bq.x;
            acc[i][j][1] += a_iq * bq.y;
            acc[i][j][2] += a_iq * bq.z;
            acc[i][j][3] += a_iq * bq.w;
          }
        }
      }
    }
  }
  __syncthreads();  // every warp is done with the ring before the next tile refills it
}

// One block per SM: 16 warps of at most 128 registers fill the register file.
template <typename T, int kSliceDepth>
__global__ void __launch_bounds__(kThreads, 1) vectorized_kernel(Problem<T> p) {
  extern __shared__ float4 shared_vectors[];  // float4 so every row below is 16-byte aligned
  float* latent = reinterpret_cast<float*>(shared_vectors);
  T* ring = reinterpret_cast<T*>(latent + kTokens * p.latent_stride);
  const int64_t token0 = int64_t(blockIdx.x) * kTokens;
  const ThreadTile mine = thread_tile();

  // GEMM 1 into the latent tile; its columns from rank to latent_columns come out 0.
  for (int64_t n0 = 0; n0 < p.latent_columns; n0 += kColumns) {
    Tile acc = {};
    accumulate_tile<T, kSliceDepth, false>(acc, p, token0, n0, nullptr, ring);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int64_t first = n0 + column_of(mine, j);
      if (first >= p.latent_columns) continue;  // latent_columns is a multiple of 4
      for (int i = 0; i < kRows; ++i) {
        store_four<mla::Space::kShared>(latent + row_of(mine, i) * p.latent_stride + first, acc[i][j]);
      }
    }
  }
  __syncthreads();

  for (int64_t n0 = blockIdx.y * int64_t(kColumns); n0 < p.columns; n0 += gridDim.y * int64_t(kColumns)) {
    Tile acc = {};
    accumulate_tile<T, kSliceDepth, true>(acc, p, token0, n0, latent, ring);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int64_t first = n0 + column_of(mine, j);
      if (first >= p.columns) continue;
      for (int i = 0; i < kRows; ++i) {
        const int64_t token = token0 + row_of(mine, i);
        if (token >= p.tokens) break;
        T* dst = p.out + token * p.columns + first;
        if (first + 4 <= p.columns && reinterpret_cast<uintptr_t>(dst) % (4 * sizeof(T)) == 0) {
          store_four<mla::Space::kGlobal>(dst, acc[i][j]);
        } else {
          for (int q = 0; q < 4 && first + q < p.columns; ++q) dst[q] = mla::from_float<T>(acc[i][j][q]);
        }
      }
    }
  }
}

// The launch with slices kSliceDepth deep, or cudaErrorInvalidValue when two of them do not fit
// beside the latent tile in this GPU's shared memory.
template <typename T, int kSliceDepth>
cudaError_t launch_with_depth(const Problem<T>& p, cudaStream_t stream) {
  const size_t shared_bytes =
      sizeof(float) * kTokens * size_t(p.latent_stride) + kBuffers * sizeof(T) * kStageElements<T, kSliceDepth>;
  const cudaError_t err = mla::allow_shared_memory(vectorized_kernel<T, kSliceDepth>, shared_bytes);
  if (err != cudaSuccess) return err;

  const int64_t token_tiles = mla::ceil_div(p.tokens, kTokens);
  // GEMM 1's work counts whole warps (kWarpColumns); a warp past the rank skips its arithmetic.
  const int splits = mla::choose_column_splits(token_tiles, mla::ceil_div(p.columns, kColumns),
                                               double(p.d_model) * double(mla::round_up(p.rank, kWarpColumns)),
                                               double(p.rank) * kColumns);
  vectorized_kernel<T, kSliceDepth>
      <<<dim3(unsigned(token_tiles), unsigned(splits)), kThreads, shared_bytes, stream>>>(p);
  return cudaGetLastError();
}

// The deepest slices from kSliceDepth down of which two fit, the shallowest one 16-byte run deep.
template <typename T, int kSliceDepth>
cudaError_t launch_deepest(const Problem<T>& p, cudaStream_t stream) {
  const cudaError_t err = launch_with_depth<T, kSliceDepth>(p, stream);
  if constexpr (kSliceDepth / 2 >= kVector<T>) {
    if (err == cudaErrorInvalidValue) return launch_deepest<T, kSliceDepth / 2>(p, stream);
  }
  return err;
}

template <typename T>
cudaError_t launch(const MlaProblem& raw, cudaStream_t stream) {
  const int latent_columns = int(mla::round_up(raw.rank, kDepth));
  const Problem<T> p{mla::Problem<T>::of(raw), latent_columns, int(mla::round_up(latent_columns, 32)) + 4};
  return launch_deepest<T, kDepth>(p, stream);
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)
