// Exercise ex02: generated from solutions/02_shared_latent.cu by `python -m mla_lab exercises`.
// Fill in each TODO, then grade: python -m mla_lab grade ex02
// Step 2 — shared latent: one block per token, the latent row in shared memory.
//
// Step 1 recomputed a token's latent row for each of its 2 * width outputs. Here the block of a
// token computes that row once into shared memory (rank floats), waits at a barrier, and every
// thread then reuses it for its output columns: d_model * rank + 2 * width * rank multiply-adds
// per token, exactly the useful count. What remains wrong, and what notebook 04 measures: every
// block still streams all of w_down and both up-projections from memory, so weight traffic grows
// with the number of tokens instead of being paid once.
//
// Launch limit: the latent row must fit the default 48 KB of dynamic shared memory, so
// rank <= 12288 (mla_lab/steps.py says so, and the binding rejects larger ranks).
#include "mla_common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxSharedBytes = 48 * 1024;

template <typename T>
__global__ void shared_latent_kernel(const T* __restrict__ hidden, const T* __restrict__ w_down,
                                     const T* __restrict__ w_up_k, const T* __restrict__ w_up_v,
                                     T* __restrict__ out, int64_t d_model, int64_t rank,
                                     int64_t width) {
  using mla::to_float;
  extern __shared__ float latent[];  // rank floats: this token's latent row
  const int64_t token = blockIdx.x;
  const T* hidden_row = hidden + token * d_model;
  T* out_row = out + token * 2 * width;

  // TODO(ex02): each thread computes latent[j] for j = threadIdx.x, threadIdx.x + blockDim.x, ... (consecutive threads read consecutive columns of w_down)
  MLA_NOT_IMPLEMENTED();
  __syncthreads();  // every thread reads all of `latent` below
  // TODO(ex02): each thread computes outputs c = threadIdx.x, threadIdx.x + blockDim.x, ... of out_row (2 * width of them: k columns first, then v) from the shared latent row
  MLA_NOT_IMPLEMENTED();
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
  // Rounded up to whole 16-byte groups: ptxas may merge the loop's tail loads of `latent` into
  // one vector read reaching up to 3 floats past rank (compute-sanitizer memcheck saw it at
  // rank 33). The padding is never used in a result.
  const int64_t shared_bytes = (p.rank + 3) / 4 * 4 * int64_t(sizeof(float));
  if (shared_bytes > kMaxSharedBytes) return cudaErrorInvalidValue;
  shared_latent_kernel<T><<<unsigned(p.tokens), kThreads, size_t(shared_bytes), stream>>>(
      static_cast<const T*>(p.hidden), static_cast<const T*>(p.w_down),
      static_cast<const T*>(p.w_up_k), static_cast<const T*>(p.w_up_v), static_cast<T*>(p.out),
      p.d_model, p.rank, p.heads * p.head_dim);
  return cudaGetLastError();
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)
