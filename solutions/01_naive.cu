// Step 1 — naive: one thread per output element.
//
// The simplest kernel that is right on every shape. Thread `idx` owns one element of the
// stacked (tokens, 2, heads * head_dim) output and recomputes, on its own, the whole latent row of
// its token: every output element costs rank * (d_model + 1) multiply-adds where rank would do.
// Notebook 03 counts that waste; step 2 removes it by sharing the latent row within a block.
#include "mla_common.cuh"

namespace {

template <typename T>
__global__ void naive_kernel(const T* __restrict__ hidden, const T* __restrict__ w_down,
                             const T* __restrict__ w_up_k, const T* __restrict__ w_up_v,
                             T* __restrict__ out, int64_t tokens, int64_t d_model, int64_t rank,
                             int64_t width) {
  using mla::to_float;
  const int64_t total = tokens * 2 * width;
  // A grid-stride loop: any output size works with any grid, and indices stay 64-bit.
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    // BEGIN SOLUTION: split idx into (token, kv, column), compute this token's latent row on the fly and dot it with column `column` of w_up_k (kv == 0) or w_up_v (kv == 1); store the result at out[idx], converted with mla::from_float<T> (out holds T, bf16 or fp32)
    // HINT 1: One thread owns one output element and computes it from scratch: its token's latent row, one latent value at a time, each a dot product of the hidden row with a column of w_down.
    // HINT 2: column = idx % width; kv = (idx / width) % 2; token = idx / (2 * width). Then for j < rank: latent_j = sum over i of hidden[token][i] * w_down[i][j], and acc += latent_j * w_up[j][column]; then store from_float<T>(acc) at out[idx].
    const int64_t column = idx % width;
    const int64_t kv = (idx / width) % 2;
    const int64_t token = idx / (2 * width);
    const T* w_up = kv == 0 ? w_up_k : w_up_v;
    const T* hidden_row = hidden + token * d_model;
    float acc = 0.0f;
    for (int64_t j = 0; j < rank; ++j) {
      float latent = 0.0f;
      for (int64_t i = 0; i < d_model; ++i) {
        latent += to_float(hidden_row[i]) * to_float(w_down[i * rank + j]);
      }
      acc += latent * to_float(w_up[j * width + column]);
    }
    out[idx] = mla::from_float<T>(acc);
    // END SOLUTION
  }
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t total = p.tokens * 2 * p.heads * p.head_dim;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  const unsigned grid = unsigned(blocks < 2147483647 ? blocks : 2147483647);
  naive_kernel<T><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(p.hidden), static_cast<const T*>(p.w_down),
      static_cast<const T*>(p.w_up_k), static_cast<const T*>(p.w_up_v), static_cast<T*>(p.out),
      p.tokens, p.d_model, p.rank, p.heads * p.head_dim);
  return cudaGetLastError();
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)
