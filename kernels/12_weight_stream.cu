// Step 12 — one to sixteen tokens: every SM streams its share of the weights straight into FFMAs.
//
// What changed from step 11, and why: with a handful of tokens the projection is a matrix-vector
// product, each weight used once per token, and the weights are almost every byte (6.3 MB at
// V2-Lite in bf16). Step 11 still runs it as a tiled GEMM: a block stages its weight tile in
// shared memory, streams 16-row token tiles through a ring and waits on tensor-core chains and a
// cluster barrier per tile, which took 9.6 µs at one token against a floor of about 2.
// - No tiles, no ring, no tensor cores: each thread loads eight columns of a few weight rows
//   straight into registers (16 bytes a row in bf16) and multiplies them by the tokens' values,
//   which the block staged in shared memory once. Two batches of rows are in flight at a time,
//   the first two before the kernel reads anything it depends on.
// - A block owns 32 columns; its 64 groups of threads split the depth and are added by warp
//   shuffles and then in shared memory. GEMM 1 (depth d_model) also splits d_model over a cluster
//   of up to 8 blocks, whose sums are added through distributed shared memory; the fp32 latent
//   goes to a scratch buffer, unrounded.
// - GEMM 2 is launched as a programmatic dependent: its blocks load their first weight rows while
//   GEMM 1 runs and wait (griddepcontrol.wait) only before they read the latent.
// - fp32 stays fp32: FFMA, no TF32 passes.
// Runs on sm_90 with 1 to 16 tokens, rank and heads * head_dim multiples of 8, 16-byte aligned
// weights and a token slice that fits shared memory (mla_takes); the binding runs the others on
// step 4. Notes: kernels/12_weight_stream.md.

#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include <cooperative_groups.h>

#include "mla_common.cuh"
#include "mla_hopper.cuh"

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kColumns = 32;                       // columns of a block
constexpr int kColumnGroups = kColumns / 8;        // threads that share a weight row, 8 columns each
constexpr int kDepthGroups = kThreads / kColumnGroups;  // threads that split a block's depth
constexpr int kMaxSplits = 8;                      // the portable cluster size
constexpr int kMaxTokens = 16;
constexpr int kSharedBudget = 227 * 1024;          // an sm_90 block's opt-in shared memory
static_assert(kColumnGroups == 4, "the shuffles' lane bits 4, 8 and 16 are a warp's depth groups");

// Eight consecutive weights of one row, as loaded: one 16-byte load in bf16, two in fp32. Read once
// per call, so they bypass L1.
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <typename T>
struct EightWeights;

template <>
struct EightWeights<__nv_bfloat16> {
  uint4 bits;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) { bits = load_streaming(p); }
  __device__ __forceinline__ void clear() { bits = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void unpack(float (&w)[8]) const {
    const uint32_t pairs[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // a bf16 is the upper half of the float it widens to
      w[2 * i] = __uint_as_float(pairs[i] << 16);
      w[2 * i + 1] = __uint_as_float(pairs[i] & 0xFFFF0000u);
    }
  }
};

template <>
struct EightWeights<float> {
  uint4 first, second;
  __device__ __forceinline__ void load(const float* p) { first = load_streaming(p), second = load_streaming(p + 4); }
  __device__ __forceinline__ void clear() { first = second = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void unpack(float (&w)[8]) const {
    const uint32_t bits[8] = {first.x, first.y, first.z, first.w, second.x, second.y, second.z, second.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __uint_as_float(bits[i]);
  }
};

// Rows of weights in one batch of a thread's loads: 128 bytes, in bf16 and fp32 alike; two batches
// are in flight at a time.
template <typename T>
constexpr int kBatch = 128 / int(sizeof(EightWeights<T>));
template <typename T>
constexpr int kBatchRows = kDepthGroups * kBatch<T>;  // a block's rows per batch

// One GEMM of the projection, C = A @ W, for a few rows of A: the tokens of hidden and w_down
// (GEMM 1, C the fp32 latent), or the latent and [w_up_k | w_up_v] (GEMM 2, C the stacked output).
template <typename T, typename In, typename Out>
struct Pass {
  const In* rows;
  int64_t row_pitch;
  mla::WeightColumns<T> weights;
  Out* out;
  int64_t out_pitch;
  int tokens, depth, columns;
  int part_depth;      // depth per block of a cluster
  bool after_primary;  // launched as a programmatic dependent of the previous kernel
};

// A block's depth is staged rounded up to whole batches, so every thread runs the same loop.
template <typename T>
__host__ __device__ constexpr int staged_depth(int part_depth) {
  return int(mla::round_up(part_depth, kBatchRows<T>));
}
// Shared memory: the tokens' values (depth-major, kTokens floats a row), each warp's sums, the
// block's sums that the cluster adds.
template <typename T, int kTokens>
constexpr int shared_bytes(int part_depth) {
  return (staged_depth<T>(part_depth) * kTokens + kWarps * kTokens * kColumns + kTokens * kColumns) * 4;
}

template <typename T, typename In, typename Out, int kTokens>
__global__ void __launch_bounds__(kThreads) stream_weights(const Pass<T, In, Out> p) {
  extern __shared__ float4 shared_words[];
  float* const values = reinterpret_cast<float*>(shared_words);  // [staged depth][kTokens]
  const int staged = staged_depth<T>(p.part_depth);
  float* const warp_sums = values + staged * kTokens;            // [kWarps][kTokens][kColumns]
  float* const block_sums = warp_sums + kWarps * kTokens * kColumns;  // [kTokens][kColumns]

  const cg::cluster_group cluster = cg::this_cluster();
  const int splits = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int depth0 = rank * p.part_depth, depth_end = min(p.depth, depth0 + p.part_depth);
  const int column_group = threadIdx.x % kColumnGroups, depth_group = threadIdx.x / kColumnGroups;
  const int column = int(blockIdx.x) * kColumns + column_group * 8;
  const bool inside = column < p.columns;  // columns come in whole groups of 8
  const T* const column_top = p.weights.at(0, inside ? column : 0);  // a group's columns lie in one matrix
  mla::launch_dependents();

  EightWeights<T> now[kBatch<T>], next[kBatch<T>];
  const auto fetch = [&](EightWeights<T>(&batch)[kBatch<T>], int first) {
#pragma unroll
    for (int i = 0; i < kBatch<T>; ++i) {
      const int row = depth0 + first + i * kDepthGroups + depth_group;
      if (inside && row < depth_end) {
        batch[i].load(column_top + int64_t(row) * p.weights.ld);
      } else {
        batch[i].clear();
      }
    }
  };
  // Two batches in flight before the wait: the weights do not depend on the kernel before.
  fetch(now, 0);
  if (kBatchRows<T> < staged) fetch(next, kBatchRows<T>);

  // GEMM 2's rows are GEMM 1's output: read them only once GEMM 1 has finished and flushed.
  if (p.after_primary) mla::wait_for_previous_kernel();
  // Every token's value of a depth in flight at once (staged is a multiple of kThreads).
#pragma unroll 4
  for (int k = threadIdx.x; k < staged; k += kThreads) {
    float x[kTokens];
#pragma unroll
    for (int token = 0; token < kTokens; ++token) {
      x[token] = token < p.tokens && depth0 + k < depth_end
                     ? mla::to_float(p.rows[int64_t(token) * p.row_pitch + depth0 + k])
                     : 0.0f;
    }
#pragma unroll
    for (int token = 0; token < kTokens; ++token) values[k * kTokens + token] = x[token];
  }
  __syncthreads();

  float sum[kTokens][8] = {};
  for (int first = 0; first < staged; first += kBatchRows<T>) {
#pragma unroll
    for (int i = 0; i < kBatch<T>; ++i) {
      float w[8];
      now[i].unpack(w);
      const float* x = values + (first + i * kDepthGroups + depth_group) * kTokens;
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
#pragma unroll
        for (int j = 0; j < 8; ++j) sum[t][j] = fmaf(x[t], w[j], sum[t][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch<T>; ++i) now[i] = next[i];
    if (first + 2 * kBatchRows<T> < staged) fetch(next, first + 2 * kBatchRows<T>);
  }

  // A warp's lanes are 8 depth groups times the 4 column groups: add over the depth groups. Each
  // round halves what a lane holds: it sends its partner the half of its columns that the partner
  // keeps, and adds the other half of the partner's to its own (7 shuffles a token, not 24). Lane
  // bit 16 picks columns 4-7 or 0-3, bit 8 then 2-3 or 0-1 of those, bit 4 the odd or even one.
#pragma unroll
  for (int live = 8, lane_bit = 16; live > 1; live /= 2, lane_bit /= 2) {
    const bool upper = threadIdx.x & lane_bit;
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
#pragma unroll
      for (int j = 0; j < live / 2; ++j) {
        const float send = upper ? sum[t][j] : sum[t][j + live / 2];
        const float keep = upper ? sum[t][j + live / 2] : sum[t][j];
        sum[t][j] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, lane_bit);
      }
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kept_column = column_group * 8 + (lane >> 4 & 1) * 4 + (lane >> 3 & 1) * 2 + (lane >> 2 & 1);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) warp_sums[(warp * kTokens + t) * kColumns + kept_column] = sum[t][0];
  __syncthreads();
  for (int i = threadIdx.x; i < kTokens * kColumns; i += kThreads) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w * kTokens * kColumns + i];
    block_sums[i] = total;
  }

  // The cluster's blocks add their sums; each block adds and stores every splits-th of them.
  cluster.sync();
  for (int i = threadIdx.x * splits + rank; i < kTokens * kColumns; i += kThreads * splits) {
    const int token = i / kColumns, out_column = int(blockIdx.x) * kColumns + i % kColumns;
    if (token >= p.tokens || out_column >= p.columns) continue;
    float total = 0.0f;
    for (int r = 0; r < splits; ++r) total += cluster.map_shared_rank(block_sums, r)[i];
    p.out[int64_t(token) * p.out_pitch + out_column] = mla::from_float<Out>(total);
  }
  // No block may leave while another still reads its sums.
  cluster.sync();
}

// A pass's split of its depth over a cluster: enough blocks to fill the GPU once, at most
// kMaxSplits, and a row of each part for every depth group.
int splits_of(int64_t columns, int64_t depth) {
  const int64_t column_blocks = mla::ceil_div(columns, kColumns);
  const int64_t fill = std::max<int64_t>(1, mla::multiprocessor_count() / column_blocks);
  return int(std::min<int64_t>({kMaxSplits, fill, mla::ceil_div(depth, kDepthGroups)}));
}
int part_depth_of(int64_t depth, int splits) { return int(mla::ceil_div(depth, splits)); }

// use(std::integral_constant<int, n>()) for the token count n the kernels are compiled for: the
// fewest of 1, 2, 4, 8 and 16 that holds `tokens` (a thread keeps n x 8 sums in registers).
template <class Use>
auto with_compiled_tokens(int64_t tokens, Use use) {
  if (tokens <= 1) return use(std::integral_constant<int, 1>());
  if (tokens <= 2) return use(std::integral_constant<int, 2>());
  if (tokens <= 4) return use(std::integral_constant<int, 4>());
  if (tokens <= 8) return use(std::integral_constant<int, 8>());
  return use(std::integral_constant<int, kMaxTokens>());
}

template <typename T>
int pass_shared_bytes(int64_t tokens, int part_depth) {
  return with_compiled_tokens(tokens, [&](auto n) { return shared_bytes<T, decltype(n)::value>(part_depth); });
}

template <typename T>
bool fits(const MlaProblem& p) {
  const int64_t columns = 2 * p.heads * p.head_dim;
  const int down_part = part_depth_of(p.d_model, splits_of(p.rank, p.d_model));
  const int up_part = part_depth_of(p.rank, splits_of(columns, p.rank));
  return pass_shared_bytes<T>(p.tokens, down_part) <= kSharedBudget &&
         pass_shared_bytes<T>(p.tokens, up_part) <= kSharedBudget;
}

bool takes_fast_path(const MlaProblem* p) {
  const bool sizes = p->tokens <= kMaxTokens && p->rank % 8 == 0 && (p->heads * p->head_dim) % 8 == 0 &&
                     p->d_model < (int64_t(1) << 30) && p->rank < (int64_t(1) << 30) &&
                     2 * p->heads * p->head_dim < (int64_t(1) << 30);
  const bool aligned = mla::aligned16(p->w_down) && mla::aligned16(p->w_up_k) &&
                       mla::aligned16(p->w_up_v);
  const bool room = sizes && (p->dtype == MLA_FLOAT32 ? fits<float>(*p) : fits<__nv_bfloat16>(*p));
  return mla::on_hopper() && sizes && aligned && room;
}

template <typename T, typename In, typename Out, int kTokens>
cudaError_t launch_pass(const Pass<T, In, Out>& pass, int splits, cudaStream_t stream) {
  const auto kernel = stream_weights<T, In, Out, kTokens>;
  const int bytes = shared_bytes<T, kTokens>(pass.part_depth);
  cudaError_t err = mla::allow_shared_memory(kernel, size_t(bytes));
  if (err != cudaSuccess) return err;
  return mla::launch(pass.after_primary, unsigned(splits), kernel,
                     dim3(unsigned(mla::ceil_div(pass.columns, kColumns)), unsigned(splits), 1), dim3(kThreads),
                     size_t(bytes), stream, pass);
}

template <typename T, int kTokens>
cudaError_t launch_for(const MlaProblem& p, cudaStream_t stream) {
  const mla::Problem<T> m = mla::Problem<T>::of(p);
  float* latent = static_cast<float*>(p.workspace);
  const int down_splits = splits_of(p.rank, p.d_model), up_splits = splits_of(m.columns, p.rank);
  const Pass<T, T, float> down{m.hidden, p.d_model, m.down, latent, p.rank, int(p.tokens), int(p.d_model),
                               int(p.rank), part_depth_of(p.d_model, down_splits), false};
  const Pass<T, float, T> up{latent, p.rank, m.up, m.out, m.columns, int(p.tokens), int(p.rank), int(m.columns),
                             part_depth_of(p.rank, up_splits), true};
  cudaError_t err = launch_pass<T, T, float, kTokens>(down, down_splits, stream);
  return err != cudaSuccess ? err : launch_pass<T, float, T, kTokens>(up, up_splits, stream);
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
  return with_compiled_tokens(p.tokens, [&](auto n) { return launch_for<T, decltype(n)::value>(p, stream); });
}

}  // namespace

extern "C" int mla_takes(const MlaProblem* p) { return takes_fast_path(p); }

// The latent between the two kernels: tokens x rank in fp32.
extern "C" size_t mla_workspace_bytes(const MlaProblem* p) {
  if (!takes_fast_path(p)) return 0;
  return size_t(mla::round_up(p->tokens * p->rank * 4, 256));
}

extern "C" cudaError_t mla_launch(const MlaProblem* p, cudaStream_t stream) {
  if (!takes_fast_path(p) || p->workspace == nullptr) return cudaErrorNotSupported;  // the binding runs step 4
  return mla::dispatch(p, stream, launch<float>, launch<__nv_bfloat16>);
}
