// One correct kernel with one planted mistake per file: tests/wrong_kernels/*.cu each define one
// MLA_WRONG_* macro and include this, and the grader must reject each with its own message
// (tests/test_wrong_kernels.py; the file's `// EXPECT:` line holds the words it must say).
//
// The kernel: one block per token, its latent row in shared memory, then the block's threads
// share out the token's 2 * width outputs.
#pragma once

#include "mla_common.cuh"

namespace {

constexpr int kThreads = 256;

#if defined(MLA_WRONG_TF32)
// fp32 operands rounded to TF32 before each product: TF32's error in a step held to fp32's.
__device__ __forceinline__ float operand(float x) { return __uint_as_float(mla::round_to_tf32(x)); }
#else
__device__ __forceinline__ float operand(float x) { return x; }
#endif
__device__ __forceinline__ float operand(__nv_bfloat16 x) { return mla::to_float(x); }

template <typename T>
__global__ void __launch_bounds__(kThreads) token_kernel(const MlaProblem p) {
  extern __shared__ float latent[];
  const T* hidden = static_cast<const T*>(p.hidden) + blockIdx.x * p.d_model;
  const T* w_down = static_cast<const T*>(p.w_down);
  const int64_t width = p.heads * p.head_dim;
#if defined(MLA_WRONG_UNINITIALISED_SHARED)
  const int64_t computed = p.rank - 1;  // the last latent value is read but never written
#else
  const int64_t computed = p.rank;
#endif
  for (int64_t j = threadIdx.x; j < computed; j += kThreads) {
#if defined(MLA_WRONG_ACCUMULATOR_NOT_ZEROED)
    float sum = latent[j];  // whatever the block before left in shared memory
#else
    float sum = 0.0f;
#endif
    for (int64_t i = 0; i < p.d_model; ++i) sum += operand(hidden[i]) * operand(w_down[i * p.rank + j]);
    latent[j] = sum;
  }
  __syncthreads();
  T* out = static_cast<T*>(p.out) + blockIdx.x * 2 * width;
  for (int64_t c = threadIdx.x; c < 2 * width; c += kThreads) {
#if defined(MLA_WRONG_KV_SWAPPED)
    const T* w_up = static_cast<const T*>(c < width ? p.w_up_v : p.w_up_k);
#else
    const T* w_up = static_cast<const T*>(c < width ? p.w_up_k : p.w_up_v);
#endif
    const int64_t column = c < width ? c : c - width;
    float acc = 0.0f;
    for (int64_t j = 0; j < p.rank; ++j) acc += operand(latent[j]) * operand(w_up[j * width + column]);
    out[c] = mla::from_float<T>(acc);
  }
}

template <typename T>
__global__ void clobber_first_input(const MlaProblem p) {
  *static_cast<T*>(const_cast<void*>(p.hidden)) = mla::from_float<T>(0.0f);
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
#if defined(MLA_WRONG_NO_TAIL_GUARD)
  const unsigned blocks = unsigned(p.tokens / 4 * 4);  // whole groups of 4 tokens: the tail is dropped
#else
  const unsigned blocks = unsigned(p.tokens);
#endif
  const size_t bytes = size_t(p.rank) * sizeof(float);
  cudaError_t err = mla::allow_shared_memory(token_kernel<T>, bytes);
  if (err != cudaSuccess || blocks == 0) return err;
#if defined(MLA_WRONG_LEGACY_STREAM)
  stream = 0;  // the legacy default stream, not the caller's
#elif defined(MLA_WRONG_SIDE_STREAM)
  static cudaStream_t own = nullptr;  // a stream of its own, waited for on the host
  if (own == nullptr && (err = cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking)) != cudaSuccess) return err;
  stream = own;
#elif defined(MLA_WRONG_CACHED_OUTPUT)
  static const void *last_hidden = nullptr, *last_out = nullptr;  // same addresses: "same call", skipped
  if (p.hidden == last_hidden && p.out == last_out) return cudaSuccess;
  last_hidden = p.hidden, last_out = p.out;
#endif
  token_kernel<T><<<blocks, kThreads, bytes, stream>>>(p);
#if defined(MLA_WRONG_INPUTS_MODIFIED)
  clobber_first_input<T><<<1, 1, 0, stream>>>(p);
#endif
#if defined(MLA_WRONG_SIDE_STREAM)
  if ((err = cudaStreamSynchronize(stream)) != cudaSuccess) return err;
#endif
  return cudaGetLastError();
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)
