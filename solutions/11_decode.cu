// Step 11 — decode: few tokens at real widths, where the weights are the traffic.
//
// What changed from step 8, and why: at V2-Lite's widths a decode batch's operands no longer fit
// one block, and with 1 to a few hundred tokens the weights (6 MB in bf16) outweigh the tokens
// many times over. Streaming them from DRAM once takes about 2 µs on an H100; every earlier step
// either re-reads them per token tile or leaves most SMs idle.
// - Weights stay put: each block loads one 32-column tile of one weight matrix into shared memory,
//   once, and the tokens stream past it in 16- or 64-row tiles through a cp.async ring. Every
//   weight byte leaves DRAM once, with ~128 blocks pulling at the same time.
// - GEMM 1 splits d_model over a cluster of up to 8 blocks; their partial latent tiles are added
//   through distributed shared memory, each block adding and storing its share of the rows.
// - GEMM 2 is a second kernel launched as a programmatic dependent: its blocks load their up-
//   projection tiles while GEMM 1 runs and wait (griddepcontrol.wait) only to read the latent.
// - bf16 on m16n8k16; fp32 in three TF32 passes, which keeps fp32's tolerance.
// Runs on sm_90 with d_model, rank and heads * head_dim multiples of 8 and 16-byte aligned
// tensors (mla_takes); the binding runs the others on step 4. Notes: kernels/11_decode.md.

#include <stdint.h>

#include <algorithm>

#include <cooperative_groups.h>

#include "mla_common.cuh"
#include "mla_hopper.cuh"

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;            // eight warps: four 8-column groups times two halves of each slot's depth
constexpr int kColumns = 32;             // columns of a weight tile
constexpr int kMaxSplits = 8;            // the portable cluster size
constexpr int kSplitDepth = 256;         // GEMM 1's depth per block, below which it splits no further
constexpr int kSharedBudget = 227 * 1024;  // an sm_90 block's opt-in shared memory

// Row pitches in elements, padded so that the 8 rows one ldmatrix (or one mma operand
// load) touches fall in different banks.
template <typename T> constexpr int kWeightPitch = kColumns + 8;
template <typename T> __host__ __device__ constexpr int row_pitch(int depth) { return depth + 16 / int(sizeof(T)); }
constexpr int kPartialPitch = kColumns + 8;  // floats

// One GEMM of the projection, C = A @ W: A's rows are the tokens (hidden for GEMM 1, the latent
// for GEMM 2), W is w_down or [w_up_k | w_up_v], C is the latent or the stacked output.
template <typename T>
struct Pass {
  const T* rows;
  int64_t row_pitch;
  mla::WeightColumns<T> weights;
  T* out;
  int64_t out_pitch;
  int tokens, depth, columns;
  int part_depth;      // depth per block of a cluster (a multiple of 16)
  int slot_depth;      // depth of one ring slot: the whole part where it fits (a multiple of 16)
  int stages;          // ring slots
  bool after_primary;  // launched as a programmatic dependent of the previous kernel
};

// Shared memory: the weight tile, the ring of token slots, two tiles of partial sums.
template <typename T>
__host__ __device__ constexpr int weight_bytes(int part_depth) { return part_depth * kWeightPitch<T> * int(sizeof(T)); }
template <typename T>
__host__ __device__ constexpr int slot_bytes(int rows, int slot_depth) { return rows * row_pitch<T>(slot_depth) * int(sizeof(T)); }
template <typename T>
constexpr int shared_bytes(int rows, int part_depth, int slot_depth, int stages) {
  return weight_bytes<T>(part_depth) + stages * slot_bytes<T>(rows, slot_depth) + 2 * rows * kPartialPitch * 4;
}

__device__ __forceinline__ void zero_16(void* to) { *static_cast<uint4*>(to) = make_uint4(0, 0, 0, 0); }

// c[i] += A's row tile i (16 rows of the slot) @ W's 8 columns at `column` of the weight tile, over
// `depth` rows of W from row `k0`; of its depth steps, those of this warp's `half`. bf16: m16n8k16 with ldmatrix.
template <int kRowTiles>
__device__ __forceinline__ void mma_slot(const __nv_bfloat16* slot, int pitch, const __nv_bfloat16* weights, int k0,
                                         int column, int half, int depth, float (&c)[kRowTiles][4],
                                         float (&)[kRowTiles][4]) {
  const int lane = threadIdx.x % 32;
  const __nv_bfloat16* a = slot + lane % 16 * pitch + lane / 16 * 8;
  const __nv_bfloat16* w = weights + (k0 + lane % 16) * kWeightPitch<__nv_bfloat16> + column;
#pragma unroll 2
  for (int k = 16 * half; k < depth; k += 32) {
    uint32_t b[2];
    mla::ldmatrix_x2_trans(b, w + k * kWeightPitch<__nv_bfloat16>);
#pragma unroll
    for (int i = 0; i < kRowTiles; ++i) {
      uint32_t af[4];
      mla::ldmatrix_x4(af, a + i * 16 * pitch + k);
      mla::mma_bf16(c[i], af, b[0], b[1]);
    }
  }
}
// fp32: m16n8k8 in three TF32 passes, the cross terms summed apart in `small`.
template <int kRowTiles>
__device__ __forceinline__ void mma_slot(const float* slot, int pitch, const float* weights, int k0, int column,
                                         int half, int depth, float (&c)[kRowTiles][4], float (&small)[kRowTiles][4]) {
  const int g = threadIdx.x % 32 / 4, q = threadIdx.x % 4;
  const float* a = slot + g * pitch + q;
  const float* w = weights + (k0 + q) * kWeightPitch<float> + column + g;
#pragma unroll 2
  for (int k = 8 * half; k < depth; k += 16) {
    const float b[2] = {w[k * kWeightPitch<float>], w[(k + 4) * kWeightPitch<float>]};
#pragma unroll
    for (int i = 0; i < kRowTiles; ++i) {
      const float* ai = a + i * 16 * pitch + k;
      const float af[4] = {ai[0], ai[8 * pitch], ai[4], ai[8 * pitch + 4]};
      mla::mma_3xtf32(c[i], small[i], af, b);
    }
  }
}

// Four results of one row, rounded once, as one store.
__device__ __forceinline__ void store_four(float* to, float4 v) {
  mla::store_whole<mla::Space::kGlobal>(to, make_uint4(__float_as_uint(v.x), __float_as_uint(v.y),
                                                        __float_as_uint(v.z), __float_as_uint(v.w)));
}
__device__ __forceinline__ void store_four(__nv_bfloat16* to, float4 v) {
  mla::store_whole<mla::Space::kGlobal>(to, make_uint2(mla::pack_bf16(v.x, v.y), mla::pack_bf16(v.z, v.w)));
}

template <typename T, int kRowTiles>
__global__ void __launch_bounds__(kThreads) stream_tokens(const Pass<T> p) {
  constexpr int kRows = 16 * kRowTiles;         // tokens per tile
  constexpr int kPerRun = 16 / int(sizeof(T));  // elements per 16-byte copy
  extern __shared__ __align__(128) uint8_t shared[];
  T* weights = reinterpret_cast<T*>(shared);
  T* ring = reinterpret_cast<T*>(shared + weight_bytes<T>(p.part_depth));
  float* partials = reinterpret_cast<float*>(shared + weight_bytes<T>(p.part_depth) +
                                             p.stages * slot_bytes<T>(kRows, p.slot_depth));
  const int pitch = row_pitch<T>(p.slot_depth);

  const cg::cluster_group cluster = cg::this_cluster();
  const int splits = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int column0 = int(blockIdx.x) * kColumns;
  const int depth0 = rank * p.part_depth;
  const int depth_end = min(p.depth, depth0 + p.part_depth);  // this block's rows of W end here
  const int column_group = threadIdx.x / 32 % 4, half = threadIdx.x / 128;  // this warp's 8 columns and depth half
  mla::launch_dependents();

  // The weight tile, once: rows past the matrix and columns past its width are zeros.
  {
    constexpr int kRunsPerRow = kColumns / kPerRun;
    const int column = threadIdx.x % kRunsPerRow * kPerRun;
    const bool inside = column0 + column < p.columns;
    const T* from = p.weights.at(depth0, inside ? column0 + column : 0);
    for (int row = threadIdx.x / kRunsPerRow; row < p.part_depth; row += kThreads / kRunsPerRow) {
      T* to = weights + row * kWeightPitch<T> + column;
      if (inside && depth0 + row < depth_end) {
        mla::copy_async_16(to, from + int64_t(row) * p.weights.ld);
      } else {
        zero_16(to);
      }
    }
  }
  mla::commit_copies();

  // GEMM 2's rows are GEMM 1's output: read them only once GEMM 1 has finished and flushed.
  if (p.after_primary) mla::wait_for_previous_kernel();

  // Ring slot s holds depth chunk s % chunks of token tile s / chunks. Rows past the last token
  // are left as they are: row m of A reaches only row m of C, which is not stored. Depth past the
  // matrix is zeroed (zero weights times stale values could make a NaN).
  const int chunks = (p.part_depth + p.slot_depth - 1) / p.slot_depth;
  const int slots = (p.tokens + kRows - 1) / kRows * chunks;
  int load_tile = 0, load_chunk = 0;  // the next slot to load
  // Each thread copies the same places of every slot: 16-byte runs first_k, first_k + k_step, ...
  // of rows first_row, first_row + row_step, ... (worked out once: a division per copy would
  // cost more instructions than the copy).
  const int runs_per_row = p.slot_depth / kPerRun, lanes = min(runs_per_row, kThreads);
  const int row_step = kThreads / lanes, first_row = threadIdx.x / lanes < row_step ? threadIdx.x / lanes : kRows;
  const int first_k = threadIdx.x % lanes * kPerRun, k_step = lanes * kPerRun;
  const auto load_next = [&](int s) {
    if (s < slots) {
      T* slot = ring + s % p.stages * (kRows * pitch);
      const int token0 = load_tile * kRows, k0 = depth0 + load_chunk * p.slot_depth;
      const int rows = min(kRows, p.tokens - token0);
      for (int row = first_row; row < rows; row += row_step) {
        const T* from = p.rows + int64_t(token0 + row) * p.row_pitch + k0;
        for (int k = first_k; k < p.slot_depth; k += k_step) {
          if (k0 + k < depth_end) {
            mla::copy_async_16(slot + row * pitch + k, from + k);
          } else {
            zero_16(slot + row * pitch + k);
          }
        }
      }
      if (++load_chunk == chunks) load_chunk = 0, ++load_tile;
    }
    mla::commit_copies();  // an empty group past the end keeps the wait counts uniform
  };
  for (int s = 0; s < p.stages - 1; ++s) load_next(s);

  float c[kRowTiles][4] = {}, small[kRowTiles][4] = {};
  int tile = 0, chunk = 0;
  for (int s = 0; s < slots; ++s) {
    mla::wait_for_copies(p.stages - 2);  // slot s (and the weight tile) have landed
    __syncthreads();                     // ...for every thread, and slot s - 1 is free again
    load_next(s + p.stages - 1);
    const int k0 = chunk * p.slot_depth;
    mma_slot<kRowTiles>(ring + s % p.stages * (kRows * pitch), pitch, weights, k0, column_group * 8, half,
                        min(p.slot_depth, p.part_depth - k0), c, small);
    if (++chunk < chunks) continue;
    chunk = 0;

    // The token tile is done: this block's partial sums go to shared memory, in one of two
    // buffers, so that the cluster can add tile t while tile t + 1 is computed. The second depth
    // half adds its sums to the first's.
    float* mine = partials + tile % 2 * kRows * kPartialPitch;
    const int g = threadIdx.x % 32 / 4, q = threadIdx.x % 4;
    for (int turn = 0; turn < 2; ++turn) {
      if (turn == half) {
#pragma unroll
        for (int i = 0; i < kRowTiles; ++i) {
          mla::add_into(c[i], small[i]);
          float2* at = reinterpret_cast<float2*>(mine + (i * 16 + g) * kPartialPitch + column_group * 8 + 2 * q);
          const float2 top = half ? at[0] : make_float2(0.0f, 0.0f);
          const float2 bottom = half ? at[4 * kPartialPitch] : make_float2(0.0f, 0.0f);
          mla::store_whole<mla::Space::kShared>(at, make_uint2(__float_as_uint(top.x + c[i][0]),
                                                               __float_as_uint(top.y + c[i][1])));
          mla::store_whole<mla::Space::kShared>(at + 4 * kPartialPitch, make_uint2(__float_as_uint(bottom.x + c[i][2]),
                                                                                   __float_as_uint(bottom.y + c[i][3])));
#pragma unroll
          for (int e = 0; e < 4; ++e) c[i][e] = small[i][e] = 0.0f;
        }
      }
      if (turn == 0) __syncthreads();
    }
    // BEGIN SOLUTION: add the cluster's partial tiles and store this block's share. The goal: for every row m < kRows of the tile with a token (tile * kRows + m < p.tokens) and every group of 4 columns inside the matrix (column0 + 4 * group < p.columns), out[token * p.out_pitch + column0 + 4 * group .. + 3] = the sum over the cluster's `splits` blocks of their `mine` entries at m * kPartialPitch + 4 * group. The invariants: each block of the cluster adds the rows m with m % splits == rank; a block's shared memory is another's through cluster.map_shared_rank(mine, r); every block's partials must be written before any block reads them (cluster.sync(), which is also a barrier of this block)
    // HINT 1: After one cluster-wide barrier, every block reads the same tile from all its neighbours' shared memory; splitting the rows among them means each sum is done once.
    // HINT 2: cluster.sync(); for (e = threadIdx.x; e < ceil(kRows / splits) * kColumns / 4; e += kThreads): m = e / (kColumns / 4) * splits + rank, group = e % (kColumns / 4); skip m >= kRows, token >= p.tokens, column >= p.columns; float4 sum over r < splits of *(const float4*)(cluster.map_shared_rank(mine, r) + m * kPartialPitch + 4 * group); store_four(p.out + token * p.out_pitch + column, sum).
    cluster.sync();
    const int row_sets = (kRows + splits - 1) / splits;
    for (int e = threadIdx.x; e < row_sets * (kColumns / 4); e += kThreads) {
      const int m = e / (kColumns / 4) * splits + rank, group = e % (kColumns / 4);
      const int token = tile * kRows + m, column = column0 + 4 * group;
      if (m >= kRows || token >= p.tokens || column >= p.columns) continue;
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int r = 0; r < splits; ++r) {
        const float4 part = *reinterpret_cast<const float4*>(cluster.map_shared_rank(mine, r) +
                                                             m * kPartialPitch + 4 * group);
        sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
      }
      store_four(p.out + int64_t(token) * p.out_pitch + column, sum);
    }
    // END SOLUTION
    ++tile;
  }
  // No block may leave while another still reads its partial tiles.
  cluster.sync();
}

// GEMM 1's split of d_model over a cluster: as many blocks as keep each part at least
// kSplitDepth deep, at most kMaxSplits.
int splits_of(int64_t d_model) { return int(std::min<int64_t>(kMaxSplits, std::max<int64_t>(1, d_model / kSplitDepth))); }
int part_depth_of(int64_t depth, int splits) { return int(mla::round_up(mla::ceil_div(depth, splits), 16)); }

// How a pass uses shared memory: 64-token tiles once there are that many tokens, else 16; the
// whole part in one slot where it fits, three slots where they fit. row_tiles 0: nothing fits.
struct Plan {
  int row_tiles, slot_depth, stages, bytes;
};
template <typename T>
Plan plan_of(int64_t tokens, int part_depth) {
  for (const int row_tiles : {4, 1}) {
    if (row_tiles == 4 && tokens < 64) continue;
    for (int slot_depth = part_depth; slot_depth >= 16; slot_depth = int(mla::round_up(slot_depth / 2, 16))) {
      for (const int stages : {3, 2}) {
        const int bytes = shared_bytes<T>(16 * row_tiles, part_depth, slot_depth, stages);
        if (bytes <= kSharedBudget) return Plan{row_tiles, slot_depth, stages, bytes};
      }
      if (slot_depth == 16) break;
    }
  }
  return Plan{0, 0, 0, 0};
}

template <typename T>
bool fits(const MlaProblem& p) {
  return plan_of<T>(1, part_depth_of(p.d_model, splits_of(p.d_model))).row_tiles != 0 &&
         plan_of<T>(1, part_depth_of(p.rank, 1)).row_tiles != 0;
}

bool takes_fast_path(const MlaProblem* p) {
  const bool sizes = p->d_model % 8 == 0 && p->rank % 8 == 0 && (p->heads * p->head_dim) % 8 == 0 &&
                     p->tokens < (int64_t(1) << 30) && p->d_model < (int64_t(1) << 30) &&
                     2 * p->heads * p->head_dim < (int64_t(1) << 30);
  const bool aligned = mla::aligned16(p->hidden) && mla::aligned16(p->w_down) &&
                       mla::aligned16(p->w_up_k) && mla::aligned16(p->w_up_v) && mla::aligned16(p->out);
  const bool room = p->dtype == MLA_FLOAT32 ? fits<float>(*p) : fits<__nv_bfloat16>(*p);
  return mla::on_hopper() && sizes && aligned && room;
}

template <typename T>
cudaError_t launch_pass(Pass<T> pass, int splits, cudaStream_t stream) {
  const Plan plan = plan_of<T>(pass.tokens, pass.part_depth);
  if (plan.row_tiles == 0) return cudaErrorInvalidValue;
  pass.slot_depth = plan.slot_depth;
  pass.stages = plan.stages;
  const auto kernel = plan.row_tiles == 4 ? stream_tokens<T, 4> : stream_tokens<T, 1>;
  cudaError_t err = mla::allow_shared_memory(kernel, size_t(plan.bytes));
  if (err != cudaSuccess) return err;
  return mla::launch(pass.after_primary, unsigned(splits), kernel,
                     dim3(unsigned(mla::ceil_div(pass.columns, kColumns)), unsigned(splits), 1), dim3(kThreads),
                     size_t(plan.bytes), stream, pass);
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
  const mla::Problem<T> m = mla::Problem<T>::of(p);
  T* latent = static_cast<T*>(p.workspace);
  const int splits = splits_of(p.d_model);
  const Pass<T> down{m.hidden, p.d_model, m.down, latent, p.rank, int(p.tokens), int(p.d_model), int(p.rank),
                     part_depth_of(p.d_model, splits), 0, 0, false};
  const Pass<T> up{latent, p.rank, m.up, m.out, m.columns, int(p.tokens), int(p.rank), int(m.columns),
                   part_depth_of(p.rank, 1), 0, 0, true};
  cudaError_t err = launch_pass(down, splits, stream);
  return err != cudaSuccess ? err : launch_pass(up, 1, stream);
}

}  // namespace

extern "C" int mla_takes(const MlaProblem* p) { return takes_fast_path(p); }

// The latent between the two kernels: tokens x rank in the inputs' dtype.
extern "C" size_t mla_workspace_bytes(const MlaProblem* p) {
  if (!takes_fast_path(p)) return 0;
  return size_t(mla::round_up(p->tokens * p->rank * (p->dtype == MLA_FLOAT32 ? 4 : 2), 256));
}

extern "C" cudaError_t mla_launch(const MlaProblem* p, cudaStream_t stream) {
  if (!takes_fast_path(p) || p->workspace == nullptr) return cudaErrorNotSupported;  // the binding runs step 4
  return mla::dispatch(p, stream, launch<float>, launch<__nv_bfloat16>);
}
