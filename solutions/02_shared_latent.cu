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

  // BEGIN SOLUTION: each thread computes latent[j] for j = threadIdx.x, threadIdx.x + blockDim.x, ... (consecutive threads read consecutive columns of w_down)
  // HINT 1: The block's threads share the latent row: each computes a strided part of it once, so no thread recomputes what another computed.
  // HINT 2: for (j = threadIdx.x; j < rank; j += blockDim.x) { acc = sum over i of hidden_row[i] * w_down[i][j]; latent[j] = acc; } Consecutive threads take consecutive j, so their reads of a w_down row coalesce.
  for (int64_t j = threadIdx.x; j < rank; j += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < d_model; ++i) {
      acc += to_float(hidden_row[i]) * to_float(w_down[i * rank + j]);
    }
    latent[j] = acc;
  }
  // END SOLUTION
  __syncthreads();  // every thread reads all of `latent` below
  // BEGIN SOLUTION: each thread computes outputs c = threadIdx.x, threadIdx.x + blockDim.x, ... of out_row (2 * width of them: k columns first, then v) from the shared latent row
  // HINT 1: Every thread reads the whole latent row from shared memory (the barrier above made it complete) and produces a strided part of the 2 * width outputs.
  // HINT 2: for (c = threadIdx.x; c < 2 * width; c += blockDim.x): k column c when c < width, else v column c - width; acc = sum over j of latent[j] * w_up[j][column]; out_row[c] = from_float<T>(acc).
  for (int64_t c = threadIdx.x; c < 2 * width; c += blockDim.x) {
    const bool is_k = c < width;
    const T* w_up = is_k ? w_up_k : w_up_v;
    const int64_t column = is_k ? c : c - width;
    float acc = 0.0f;
    for (int64_t j = 0; j < rank; ++j) {
      acc += latent[j] * to_float(w_up[j * width + column]);
    }
    out_row[c] = mla::from_float<T>(acc);
  }
  // END SOLUTION
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
