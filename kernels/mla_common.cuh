// Device helpers shared by every step: element conversion and the dtype switch.
// Inputs may be float32 or bfloat16; every step accumulates in float32 and rounds once on store.
#pragma once

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mla_launch.h"

// An exercise stub: `python -m mla_lab exercises` puts this where a solution region was. It
// compiles to nothing, and the grader finds it in the source and reports "not implemented yet".
#define MLA_NOT_IMPLEMENTED() \
  do {                        \
  } while (0)

namespace mla {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// The two up-projections seen as one (rank, 2 * width) matrix [w_up_k | w_up_v], without a copy:
// notebook 02 showed that the stacked output is exactly latent @ [w_up_k | w_up_v], so k and v
// are one GEMM. Also used for w_down alone (split == columns, so `right` is never read).
template <typename T>
struct WeightColumns {
  const T* left;
  const T* right;
  int64_t split;  // columns [0, split) come from `left`, the rest from `right`
  int64_t ld;     // row length of each part
  __device__ __forceinline__ const T* at(int64_t row, int64_t column) const {
    return column < split ? left + row * ld + column : right + row * ld + (column - split);
  }
};

// The projection as the FFMA and mma.sync steps (4 and 5) read it: both up-projections as one
// matrix of 2 * width columns.
template <typename T>
struct Problem {
  const T* hidden;
  WeightColumns<T> down, up;
  T* out;
  int64_t tokens, d_model, rank, columns;  // columns = 2 * width

  static Problem of(const MlaProblem& raw) {
    const int64_t width = raw.heads * raw.head_dim;
    const T* w_down = static_cast<const T*>(raw.w_down);
    return Problem{static_cast<const T*>(raw.hidden),
                   {w_down, w_down, raw.rank, raw.rank},
                   {static_cast<const T*>(raw.w_up_k), static_cast<const T*>(raw.w_up_v), width, width},
                   static_cast<T*>(raw.out),
                   raw.tokens, raw.d_model, raw.rank, 2 * width};
  }
};

// Asynchronous copies into shared memory (sm_80+), used by the steps that keep several slices in
// flight (4, 5 and 7): each thread issues 16-byte copies, commits them as one group per slice, and
// later waits until at most `pending` of its groups are still in flight.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void copy_async_16(uint32_t shared_dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_dst), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_async_16(void* dst, const void* src) {
  copy_async_16(shared_address(dst), src);
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// wait_group takes an immediate, hence the switch (6 or more waits for "at most 6").
__device__ __forceinline__ void wait_for_copies(int pending) {
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
  }
}
__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// One 16- or 8-byte store, kept whole. Written as a float4 / uint4 / float2 assignment, nvcc 13.0
// split some such stores into 4-byte ones: all of step 4's, one in four of step 6's output stores
// (four times the instructions, and in global memory up to four times the L2 sectors written),
// the fp32 pairs step 5 writes to shared memory (its latent and output tiles). Seen in their
// PTX; tests/test_kernel_sources.py now checks every kernel's PTX for stores split that way.
enum class Space { kGlobal, kShared };
template <Space kSpace>
__device__ __forceinline__ void store_whole(void* dst, uint4 v) {
  if constexpr (kSpace == Space::kGlobal) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  } else {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(shared_address(dst)), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w) : "memory");
  }
}
template <Space kSpace>
__device__ __forceinline__ void store_whole(void* dst, uint2 v) {
  if constexpr (kSpace == Space::kGlobal) {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(dst), "r"(v.x), "r"(v.y) : "memory");
  } else {
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(shared_address(dst)), "r"(v.x), "r"(v.y) : "memory");
  }
}
// Two floats rounded to bf16, as the 4 bytes of a __nv_bfloat162 (the lower column first).
__device__ __forceinline__ uint32_t pack_bf16(float x, float y) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Tensor-core fragments and mma.sync (sm_80+), used by steps 5 and 8. A fragment's layout is the
// PTX ISA's ("Matrix fragments for mma.m16n8k16" and "... m16n8k8"); ldmatrix gives each lane
// its part of four (or two) 8 x 8 tiles of 16-bit elements, whose rows the lanes' addresses name.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(shared_address(row)));
}
// c += a (16 x 16 bf16) @ b (16 x 8 bf16, as b0 and b1).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c += a (16 x 8 TF32) @ b (8 x 8 TF32, as b0 and b1).
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// x rounded to the nearest TF32 value (in fp32 bits). The tensor cores would otherwise drop x's
// low 13 bits, which shrinks every product a little: a bias that does not average out of a sum.
__device__ __forceinline__ uint32_t round_to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// fp32 on TF32 tensor cores at fp32's accuracy (steps 8 and 11): three passes per product.
// x = hi + lo, each a TF32 value (in fp32 bits).
template <int N>
__device__ __forceinline__ void split_tf32(const float (&x)[N], uint32_t (&hi)[N], uint32_t (&lo)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    hi[i] = round_to_tf32(x[i]);
    lo[i] = round_to_tf32(x[i] - __uint_as_float(hi[i]));
  }
}
// a * b to about fp32's accuracy: a_hi * b_hi into `big`, the cross terms into `small` (two
// chains of mma, not one of three; the caller adds them once at the end).
__device__ __forceinline__ void mma_3xtf32(float (&big)[4], float (&small)[4], const float (&a)[4],
                                           const float (&b)[2]) {
  uint32_t a_hi[4], a_lo[4], b_hi[2], b_lo[2];
  split_tf32(a, a_hi, a_lo);
  split_tf32(b, b_hi, b_lo);
  mma_tf32(small, a_lo, b_hi[0], b_hi[1]);
  mma_tf32(small, a_hi, b_lo[0], b_lo[1]);
  mma_tf32(big, a_hi, b_hi[0], b_hi[1]);
}
__device__ __forceinline__ void add_into(float (&c)[4], const float (&small)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] += small[i];
}

// The path for a 16-byte run that cp.async cannot take (misaligned, across k|v, over an edge):
// element by element, where `element(q)` is the address of the run's element q, or nullptr
// past the matrix (which stages a 0).
template <typename T, class Element>
__device__ __forceinline__ void copy_run_by_elements(T* to, Element element) {
#pragma unroll
  for (int q = 0; q < int(16 / sizeof(T)); ++q) {
    const T* from = element(q);
    to[q] = from != nullptr ? *from : from_float<T>(0.0f);
  }
}

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Whether the current GPU is an sm_90 (Hopper) one: the only GPUs the Hopper steps' code runs on.
inline bool on_hopper() {
  int device = 0, major = 0, minor = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
         minor == 0;
}

inline int multiprocessor_count() {
  int device = 0, count = 1;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 1;
  }
  return count;
}

// How many blocks share one token tile's output columns. A fused block must own a whole
// latent tile, so with few tokens there are too few blocks to fill the GPU (the toy has 12
// tiles of 32 tokens for 132 SMs). Splitting the output columns over `splits` blocks fills it,
// at a price: each of them recomputes the tile's latent (`latent_work`). The model: time is
// waves of blocks (`slots` at a time) times one block's work; pick the cheapest split.
struct ColumnSplit {
  int splits;
  double cost;
};

inline ColumnSplit cheapest_column_split(int64_t slots, int64_t token_tiles, int64_t column_tiles,
                                         double latent_work, double column_tile_work, int64_t max_splits) {
  ColumnSplit best{1, 0.0};
  for (int64_t splits = 1; splits <= column_tiles && splits <= max_splits; ++splits) {
    const double waves = double(ceil_div(token_tiles * splits, slots));
    const double cost = waves * (latent_work + column_tile_work * double(ceil_div(column_tiles, splits)));
    if (splits == 1 || cost < 0.999 * best.cost) best = ColumnSplit{int(splits), cost};
  }
  return best;
}

inline int choose_column_splits(int64_t token_tiles, int64_t column_tiles, double latent_work,
                                double column_tile_work) {
  return cheapest_column_split(multiprocessor_count(), token_tiles, column_tiles, latent_work,
                               column_tile_work, 64).splits;
}

// The most dynamic shared memory one block of this GPU may opt in to.
inline cudaError_t shared_memory_limit(int* bytes) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  return err != cudaSuccess ? err
                            : cudaDeviceGetAttribute(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
}

// Lets `kernel` use `bytes` of dynamic shared memory (above 48 KB that takes an opt-in), or
// says cudaErrorInvalidValue when this GPU has less per block than that.
template <typename Kernel>
cudaError_t allow_shared_memory(Kernel kernel, size_t bytes) {
  int limit = 0;
  const cudaError_t err = shared_memory_limit(&limit);
  if (err != cudaSuccess) return err;
  if (bytes > size_t(limit)) return cudaErrorInvalidValue;
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

using TypedLauncher = cudaError_t (*)(const MlaProblem&, cudaStream_t);

// Picks the element type named by problem->dtype; `launch<T>` is the step's templated launcher.
inline cudaError_t dispatch(const MlaProblem* problem, cudaStream_t stream,
                            TypedLauncher launch_f32, TypedLauncher launch_bf16) {
  switch (problem->dtype) {
    case MLA_FLOAT32: return launch_f32(*problem, stream);
    case MLA_BFLOAT16: return launch_bf16(*problem, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace mla

// The exported entry point of a step whose templated launcher is `launch<T>`.
#define MLA_DEFINE_LAUNCHER(launch)                                                   \
  extern "C" cudaError_t mla_launch(const MlaProblem* problem, cudaStream_t stream) { \
    return mla::dispatch(problem, stream, launch<float>, launch<__nv_bfloat16>);      \
  }
