// Step 7 — latency: for few tokens, small blocks with every weight slice in flight at once.
//
// What changed, and why: the toy (384 tokens, 19 MFLOP) is no work for a GPU, yet steps 2-6 take
// 10-50 µs there: their blocks wait more than they compute (step 3 makes 22 dependent L2 trips).
// - A block owns 8 tokens; output columns are split over blocks where that is faster.
// - One cp.async ring runs across both GEMMs; where a block's whole share fits (the toy) all of
//   it is requested before any arithmetic, so a block waits on L2 once.
// - A thread owns two adjacent output columns, so each activation feeds two multiply-adds;
//   slices are zero-padded to whole 4-row units, so the inner loop has no bounds tests.
// - Copies are issued with shifts and pointer increments, no divisions.
// FFMA in both dtypes. Launch limit: rank <= 512 (Ada's 99 KB per block).
// Measurements and the variants not kept: kernels/07_latency.md.
#include <stdint.h>

#include <algorithm>

#include "mla_common.cuh"

namespace {

constexpr int kThreads = 512;  // 16 warps: an SM's only block must hide its own latencies
constexpr int kComputing = 256;  // threads that multiply: kTokens x 2 partial sums each
constexpr int kTokens = 8;   // tokens per block
constexpr int kMaxStages = 8;  // ring depth when a block's slices do not all fit at once
constexpr int kUnit = 4;     // depth rows a thread takes at a time: one vector of activations
constexpr int kMaxPassShift = 8;  // passes of <= 256 columns: 128 pairs, so the depth splits in >= 2 groups

// The launcher's choices, the same for every block. Pass widths and the runs of a hidden row are
// powers of two, so that a thread finds its place in a slice by shifts, not divisions.
struct Geometry {
  int64_t tokens, d_model, rank, width;  // width = heads * head_dim; the output has 2 * width columns
  int latent_pass_shift;  // GEMM 1 passes over 1 << latent_pass_shift latent columns (>= 32)
  int column_pass_shift;  // GEMM 2 passes over 1 << column_pass_shift output columns (32 to 256)
  int hidden_runs_shift;  // a hidden slice row is at most 1 << hidden_runs_shift 16-byte runs
  int rows_down;       // w_down rows per slice (a multiple of 8)
  int rows_up;         // w_up rows per slice (a multiple of 8)
  int stage_elements;  // elements per ring stage (a multiple of 8: stages stay 16-byte aligned)
  int latent_stride;   // floats per latent row in shared memory
  int tiles_per_split;  // GEMM 2 passes of every block; the first `extra_tiles` splits take one more
  int extra_tiles;
  int down_slices;     // slices per GEMM 1 pass: ceil(d_model / rows_down)
  int up_slices;       // slices per GEMM 2 pass: ceil(rank / rows_up)
  int latent_passes;   // GEMM 1 passes: ceil(rank / latent pass)
  int stages;          // ring depth: one per slice when all of a block's slices fit, else kMaxStages
};

// Where a slice is in a block's order: GEMM 1's passes, then its share of GEMM 2's.
struct Position {
  bool up;
  int pass;   // GEMM 1: the latent pass; GEMM 2: this block's pass, counted from 0
  int index;  // the slice's place in its pass
  int stage;  // the ring stage it goes through
};

// One slice of the ring: `rows` weight rows from `row0` of a pass over `columns` columns from
// `column0`, for GEMM 1 (w_down, with the matching hidden columns) or GEMM 2 (w_up_k | w_up_v).
struct Slice {
  bool up;
  bool ends_pass;
  int stage;
  int pass_shift;  // log2 of the pass's width: its stride in the stage
  int columns;
  int rows;
  int64_t column0;
  int64_t row0;
};

// The block's slices in order, each position found from the one before (the ring walks them
// twice: once issuing copies, once computing).
struct Schedule {
  Geometry g;
  int split, splits;

  __device__ int total() const {
    return g.latent_passes * g.down_slices + (g.tiles_per_split + (split < g.extra_tiles)) * g.up_slices;
  }
  __device__ bool ends_pass(const Position& at) const {
    return at.index == (at.up ? g.up_slices : g.down_slices) - 1;
  }
  __device__ Position after(const Position& at) const {
    const int stage = at.stage + 1 == g.stages ? 0 : at.stage + 1;
    if (!ends_pass(at)) return Position{at.up, at.pass, at.index + 1, stage};
    if (!at.up && at.pass + 1 < g.latent_passes) return Position{false, at.pass + 1, 0, stage};
    return Position{true, at.up ? at.pass + 1 : 0, 0, stage};
  }
  __device__ Slice operator[](const Position& at) const {
    Slice s;
    s.up = at.up;
    s.ends_pass = ends_pass(at);
    s.stage = at.stage;
    if (!at.up) {
      s.pass_shift = g.latent_pass_shift;
      s.column0 = int64_t(at.pass) << g.latent_pass_shift;
      s.columns = int(min(int64_t(1) << g.latent_pass_shift, g.rank - s.column0));
      s.row0 = int64_t(at.index) * g.rows_down;
      s.rows = int(min(int64_t(g.rows_down), g.d_model - s.row0));
    } else {
      s.pass_shift = g.column_pass_shift;
      s.column0 = int64_t(split + at.pass * splits) << g.column_pass_shift;
      s.columns = int(min(int64_t(1) << g.column_pass_shift, 2 * g.width - s.column0));
      s.row0 = int64_t(at.index) * g.rows_up;
      s.rows = int(min(int64_t(g.rows_up), g.rank - s.row0));
    }
    return s;
  }
};

// Where a thread's copies in a fetch of 16-byte runs, 1 << runs_shift of them per row (at most
// kThreads), start: run t % runs of rows t / runs, t / runs + row_step, ... for thread t.
struct Lane {
  int row, column, row_step;  // column in elements
};
template <typename T>
__device__ __forceinline__ Lane lane(int runs_shift) {
  constexpr int V = 16 / sizeof(T);
  const int t = int(threadIdx.x);
  return Lane{t >> runs_shift, (t & ((1 << runs_shift) - 1)) * V, kThreads >> runs_shift};
}
template <typename T>
__device__ __forceinline__ int runs_shift(int pass_shift) {
  return pass_shift - (sizeof(T) == 4 ? 2 : 3);  // a run holds 4 floats or 8 bf16
}

// rows x columns elements into shared memory (row strides `ld` and `stride`, a multiple of 8),
// and zeros over the rest of padded_rows x padded_columns, so that the arithmetic needs no bounds
// tests. 16-byte cp.async for the thread's whole runs when the slice is aligned (tested once: its
// first row and `ld`), walking rows by pointer increments; element by element where not (tails,
// odd widths, misaligned views, the k|v boundary), so every shape stays correct.
template <typename T>
__device__ void fetch(const Lane& lane, T* dst, int stride, const T* src, int64_t ld, int rows,
                      int columns, int padded_rows, int padded_columns) {
  constexpr int V = 16 / sizeof(T);
  const int c = lane.column;
  if (c >= padded_columns) return;
  int r = lane.row;
  T* const first_to = dst + r * stride + c;
  const T* const first_from = src + r * ld + c;
  if (c + V <= columns && ld % V == 0 && mla::aligned16(first_to) && mla::aligned16(first_from)) {
    uint32_t to = mla::shared_address(first_to);
    const T* from = first_from;
    const uint32_t to_step = uint32_t(lane.row_step * stride * sizeof(T));
    const int64_t from_step = int64_t(lane.row_step) * ld;
    for (; r < rows; r += lane.row_step, to += to_step, from += from_step) mla::copy_async_16(to, from);
  }
  for (; r < padded_rows; r += lane.row_step) {
    T* to = dst + r * stride + c;
    const T* from = src + r * ld + c;
    for (int i = 0; i < V && c + i < padded_columns; ++i) {
      to[i] = r < rows && c + i < columns ? from[i] : mla::from_float<T>(0.0f);
    }
  }
}

template <typename T>
__device__ void issue(const Slice& s, T* stage, const Geometry& g, const T* hidden,
                      const T* w_down, const T* w_up_k, const T* w_up_v, int64_t token0, int tokens_here) {
  const int padded_rows = (s.rows + kUnit - 1) / kUnit * kUnit;
  const int odd = s.columns % 2;  // the last pair's second column: zeros, from the last part fetched
  const int pass_width = 1 << s.pass_shift;
  const Lane weight_lane = lane<T>(runs_shift<T>(s.pass_shift));
  if (!s.up) {
    fetch(weight_lane, stage, pass_width, w_down + s.row0 * g.rank + s.column0, g.rank, s.rows, s.columns,
          padded_rows, s.columns + odd);
    // kTokens x rows_down, token-major; rows past the last token are zeros.
    fetch(lane<T>(g.hidden_runs_shift), stage + g.rows_down * pass_width, g.rows_down,
          hidden + token0 * g.d_model + s.row0, g.d_model, tokens_here, s.rows, kTokens, padded_rows);
    return;
  }
  // Output columns [column0, column0 + columns) of [w_up_k | w_up_v]: the k part, then the v part.
  const int64_t end = s.column0 + s.columns;
  if (s.column0 < g.width) {
    const int columns = int(min(end, g.width) - s.column0);
    fetch(weight_lane, stage, pass_width, w_up_k + s.row0 * g.width + s.column0, g.width, s.rows, columns,
          padded_rows, columns + (end > g.width ? 0 : odd));
  }
  if (end > g.width) {
    const int64_t v0 = max(s.column0, g.width);
    fetch(weight_lane, stage + (v0 - s.column0), pass_width, w_up_v + s.row0 * g.width + (v0 - g.width),
          g.width, s.rows, int(end - v0), padded_rows, int(end - v0) + odd);
  }
}

__device__ __forceinline__ void load_unit(float (&a)[kUnit], const float* p) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;
}
__device__ __forceinline__ void load_unit(float (&a)[kUnit], const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  a[0] = lo.x, a[1] = lo.y, a[2] = hi.x, a[3] = hi.y;
}
__device__ __forceinline__ float2 load_pair(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

using Sums = float[kTokens][2];  // one thread's tokens x its column pair

// A computing thread's place in a pass of 1 << pass_shift columns: the column pair it owns and
// its depth group, of `groups` (which split the pass's rows between them).
struct Work {
  int column, group, groups;
};
__device__ __forceinline__ Work work(int pass_shift) {
  const int pairs_shift = pass_shift - 1;
  const int t = int(threadIdx.x);
  return Work{(t & ((1 << pairs_shift) - 1)) * 2, t >> pairs_shift, kComputing >> pairs_shift};
}

// acc[m][j] += activations[m][k] * weights[k][column + j] over this depth group's rows of the
// slice: units group, group + groups, ... of kUnit rows. Past `rows`, up to the next whole unit,
// both operands are zeros (fetch pads them), so no row needs a test.
template <typename T, typename A>
__device__ __forceinline__ void accumulate(Sums& acc, const T* weights, int stride, const A* activations,
                                           int activation_stride, int rows, int column, int group,
                                           int groups) {
  // BEGIN SOLUTION: this thread's share of the slice. The goal: acc[m][j] += activations[m][k] * weights[k][column + j] for the kTokens tokens m, the thread's two columns j and the rows k of its depth group. The invariants: the group owns units of kUnit rows, starting at unit `group` and every `groups` units on, up to `rows` (the slices are zero-padded to whole units, so no row needs a test); load each unit of each token's activations once (load_unit), and each weight row's two columns at once (load_pair), so that every activation loaded feeds two multiply-adds
  // HINT 1: Split the depth over thread groups and give each thread two adjacent columns: one activation load then feeds two multiply-adds, and the zero padding lets the loop run whole units without tests.
  // HINT 2: for (k = group * kUnit; k < rows; k += groups * kUnit) { float a[kTokens][kUnit] via load_unit per token; for i < kUnit: w = load_pair(weights + (k + i) * stride + column); for m: acc[m][0] += a[m][i] * w.x; acc[m][1] += a[m][i] * w.y; }
  for (int k = group * kUnit; k < rows; k += groups * kUnit) {
    float a[kTokens][kUnit];
#pragma unroll
    for (int m = 0; m < kTokens; ++m) load_unit(a[m], activations + m * activation_stride + k);
#pragma unroll
    for (int i = 0; i < kUnit; ++i) {
      const float2 w = load_pair(weights + (k + i) * stride + column);
#pragma unroll
      for (int m = 0; m < kTokens; ++m) {
        acc[m][0] += a[m][i] * w.x;
        acc[m][1] += a[m][i] * w.y;
      }
    }
  }
  // END SOLUTION
}

// 512 threads x 128 registers fill an SM's 64K: one block per SM, which is all its shared memory
// holds at the toy and at V2-Lite anyway. (ptxas chose 64 under __launch_bounds__(512), and
// spilled; a limit of 80 ran 6-7 % slower at V2-Lite.)
template <typename T>
__global__ void __maxnreg__(128)
    latency_kernel(const T* __restrict__ hidden, const T* __restrict__ w_down,
                   const T* __restrict__ w_up_k, const T* __restrict__ w_up_v, T* __restrict__ out,
                   const Geometry g) {
  extern __shared__ float4 shared_vectors[];  // float4 so every region below is 16-byte aligned
  // kTokens x kComputing x 2 partial sums: token m's pair of computing thread t at
  // (m * kComputing + t) * 2, so that the adding threads read consecutive columns
  float* partial = reinterpret_cast<float*>(shared_vectors);
  float* latent = partial + kTokens * kComputing * 2;  // kTokens x latent_stride
  T* ring = reinterpret_cast<T*>(latent + kTokens * g.latent_stride);
  const int64_t token0 = int64_t(blockIdx.x) * kTokens;
  const int tokens_here = int(min(int64_t(kTokens), g.tokens - token0));
  const Schedule schedule{g, int(blockIdx.y), int(gridDim.y)};
  const int total = schedule.total();
  auto stage = [&](const Slice& s) { return ring + s.stage * g.stage_elements; };
  // The latent's padding columns are GEMM 2's last unit: zeros, like the weight rows they meet.
  for (int e = threadIdx.x; e < kTokens * (g.latent_stride - g.rank); e += kThreads) {
    const int m = e / (g.latent_stride - int(g.rank)), c = int(g.rank) + e % (g.latent_stride - int(g.rank));
    latent[m * g.latent_stride + c] = 0.0f;
  }

  // The ring: `ahead` slices are requested before any arithmetic, every slice when they all fit,
  // else stages - 1 of them, the last stage being refilled as each slice is used. Each step
  // commits one group (empty past the end), so "all but ahead - 1 groups done" means "slice q has
  // landed".
  const int ahead = total <= g.stages ? total : g.stages - 1;
  auto fetch_slice = [&](const Position& at) {
    const Slice s = schedule[at];
    issue(s, stage(s), g, hidden, w_down, w_up_k, w_up_v, token0, tokens_here);
  };
  Position fetching{false, 0, 0, 0};
  for (int q = 0; q < ahead; ++q, fetching = schedule.after(fetching)) {
    fetch_slice(fetching);
    mla::commit_copies();
  }
  Sums acc = {};
  Position computing{false, 0, 0, 0};
  for (int q = 0; q < total; ++q, computing = schedule.after(computing)) {
    mla::wait_for_copies(ahead - 1);
    __syncthreads();  // slice q is in, from every thread's copies; slice q - 1's stage is free
    if (q + ahead < total) {
      fetch_slice(fetching);
      fetching = schedule.after(fetching);
    }
    mla::commit_copies();

    const Slice s = schedule[computing];
    const Work w = work(s.pass_shift);
    const int pass_width = 1 << s.pass_shift;
    if (w.group < w.groups && w.column < s.columns) {
      const T* weights = stage(s);
      if (s.up) {
        accumulate(acc, weights, pass_width, latent + s.row0, g.latent_stride, s.rows, w.column,
                   w.group, w.groups);
      } else {
        accumulate(acc, weights, pass_width, weights + g.rows_down * pass_width, g.rows_down,
                   s.rows, w.column, w.group, w.groups);
      }
    }
    if (!s.ends_pass) continue;

    // End of a pass: add the depth groups' partial sums, then keep (GEMM 1) or store (GEMM 2).
    // BEGIN SOLUTION: add the depth groups' partial sums of this pass. The goal: for each token m and column c of the pass (c < s.columns), the sum over the w.groups depth groups, kept in `latent` at column s.column0 + c for GEMM 1, stored to the stacked output for GEMM 2 (real tokens only, converted with mla::from_float<T>). The invariants: each computing thread (threadIdx.x < kComputing) puts its kTokens sums pairs in `partial`, token m's pair of thread t at (m * kComputing + t) * 2, and zeroes acc for the next pass; the whole block waits for them, then shares out the kTokens x pass_width results; with this layout, group j's entry for column c of token m lies j << s.pass_shift after group 0's
    // HINT 1: Each depth group holds partial sums: they meet in shared memory, after one barrier every result is the sum of its groups' entries.
    // HINT 2: threads < kComputing store float2(acc[m][0], acc[m][1]) at partial + (m * kComputing + t) * 2 and zero acc; __syncthreads(); for e < kTokens << pass_shift: m = e >> pass_shift, c = e & (pass_width - 1); skip c >= s.columns; sum over j < w.groups of partial[m * kComputing * 2 + (j << pass_shift) + c]; GEMM 1: latent[m][s.column0 + c] = sum; GEMM 2 (m < tokens_here): out[(token0 + m) * 2 * width + s.column0 + c] = from_float<T>(sum).
    if (threadIdx.x < kComputing) {
#pragma unroll
      for (int m = 0; m < kTokens; ++m) {
        *reinterpret_cast<float2*>(partial + (m * kComputing + threadIdx.x) * 2) = make_float2(acc[m][0], acc[m][1]);
        acc[m][0] = acc[m][1] = 0.0f;
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kTokens << s.pass_shift; e += kThreads) {
      const int m = e >> s.pass_shift, c = e & (pass_width - 1);
      if (c >= s.columns) continue;
      float sum = 0.0f;
      for (int j = 0; j < w.groups; ++j) sum += partial[m * kComputing * 2 + (j << s.pass_shift) + c];
      if (!s.up) {
        latent[m * g.latent_stride + s.column0 + c] = sum;
      } else if (m < tokens_here) {
        out[(token0 + m) * (2 * g.width) + s.column0 + c] = mla::from_float<T>(sum);
      }
    }
    // END SOLUTION
    // The next write to `partial` ends the next pass, after at least one more barrier above.
  }
}

// Blocks of this many columns per GEMM 2 pass, and this many splits of a token tile's passes
// over blocks: for each pass width, step 4's cheapest split (waves of blocks times one block's
// multiply-adds), then the cheapest width.
struct Split {
  int column_pass;
  int splits;
};

int shift_at_least(int64_t n) {  // the smallest s with 1 << s >= n
  int s = 0;
  while ((int64_t(1) << s) < n) ++s;
  return s;
}

Split choose_split(int64_t token_tiles, const Geometry& g) {
  const int64_t slots = mla::multiprocessor_count();
  Split best{1 << kMaxPassShift, 1};
  double best_cost = 0.0;
  for (int pass = 1 << kMaxPassShift; pass >= 32; pass /= 2) {  // on a tie the wider pass: fewer barriers
    const mla::ColumnSplit split = mla::cheapest_column_split(
        slots, token_tiles, mla::ceil_div(2 * g.width, pass), double(g.d_model) * double(g.rank),
        double(g.rank) * pass, 1024);
    if (best_cost == 0.0 || split.cost < 0.999 * best_cost) {
      best = Split{pass, split.splits};
      best_cost = split.cost;
    }
  }
  return best;
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
  Geometry g{};
  g.tokens = p.tokens;
  g.d_model = p.d_model;
  g.rank = p.rank;
  g.width = p.heads * p.head_dim;
  g.latent_pass_shift = std::min(shift_at_least(std::max<int64_t>(p.rank, 32)), kMaxPassShift);
  const int latent_pass = 1 << g.latent_pass_shift;
  g.latent_stride = int(mla::round_up(p.rank, kUnit));
  const int64_t token_tiles = mla::ceil_div(p.tokens, kTokens);
  const Split split = choose_split(token_tiles, g);
  g.column_pass_shift = shift_at_least(split.column_pass);
  const int column_tiles = int(mla::ceil_div(2 * g.width, split.column_pass));
  g.tiles_per_split = column_tiles / split.splits;
  g.extra_tiles = column_tiles % split.splits;
  g.latent_passes = int(mla::ceil_div(p.rank, latent_pass));

  // Every slice of a block in flight at once where that fits beside the latent: a slice per
  // pass (the toy: one for GEMM 1, one for GEMM 2). Elsewhere a ring of kMaxStages slices of up
  // to 12 KB, as large as this GPU's shared memory allows.
  int limit = 0;
  cudaError_t err = mla::shared_memory_limit(&limit);
  if (err != cudaSuccess) return err;
  const size_t fixed_bytes = sizeof(float) * kTokens * (2 * kComputing + size_t(g.latent_stride));
  if (size_t(limit) <= fixed_bytes) return cudaErrorInvalidValue;
  const int64_t room = limit - int64_t(fixed_bytes);
  auto stage_elements = [&](int64_t rows_down, int64_t rows_up) {
    return std::max(rows_down * (latent_pass + kTokens), rows_up * split.column_pass);
  };
  const int64_t passes = g.latent_passes + mla::ceil_div(column_tiles, split.splits);
  const int64_t whole = stage_elements(mla::round_up(p.d_model, 8), mla::round_up(p.rank, 8));
  constexpr int64_t kRunElements = 16 / sizeof(T);
  // (a hidden row of a slice must fit one row of threads' 16-byte runs: kThreads runs)
  if (passes <= kMaxStages && passes * whole * int64_t(sizeof(T)) <= room &&
      mla::round_up(p.d_model, 8) <= kThreads * kRunElements) {
    g.stages = int(passes);
    g.rows_down = int(mla::round_up(p.d_model, 8));
    g.rows_up = int(mla::round_up(p.rank, 8));
  } else {
    g.stages = kMaxStages;
    const int64_t budget = std::min<int64_t>(12 * 1024, room / kMaxStages) / int64_t(sizeof(T));
    g.rows_down = int(std::min(std::max<int64_t>(budget / (latent_pass + kTokens) / 8 * 8, 8),
                               mla::round_up(p.d_model, 8)));
    g.rows_up = int(std::min(std::max<int64_t>(budget / split.column_pass / 8 * 8, 8),
                             mla::round_up(p.rank, 8)));
  }
  g.down_slices = int(mla::ceil_div(p.d_model, g.rows_down));
  g.up_slices = int(mla::ceil_div(p.rank, g.rows_up));
  g.stage_elements = int(stage_elements(g.rows_down, g.rows_up));
  g.hidden_runs_shift = shift_at_least(mla::ceil_div(g.rows_down, kRunElements));
  const size_t shared_bytes = fixed_bytes + size_t(g.stages) * g.stage_elements * sizeof(T);
  err = mla::allow_shared_memory(latency_kernel<T>, shared_bytes);
  if (err != cudaSuccess) return err;
  const dim3 grid{unsigned(token_tiles), unsigned(split.splits)};
  latency_kernel<T><<<grid, kThreads, shared_bytes, stream>>>(
      static_cast<const T*>(p.hidden), static_cast<const T*>(p.w_down),
      static_cast<const T*>(p.w_up_k), static_cast<const T*>(p.w_up_v), static_cast<T*>(p.out), g);
  return cudaGetLastError();
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)
