// Exercise ex08: generated from solutions/08_bulk_mma.cu by `python -m mla_lab exercises`.
// Fill in each TODO, then grade: python -m mla_lab grade ex08
// Step 8 — Hopper, for few tokens: the operands fetched by a few TMA bulk copies, both GEMMs on
// mma.sync tensor cores.
//
// What changed from step 7, and why: step 7's toy blocks spend most of their time issuing
// instructions (copies, then a chain of dependent FFMAs with few warps to interleave).
// - A block owns 16 tokens and a slice of [k | v]'s columns; the most splits that fit one wave.
// - The copies are TMA bulk copies, one per contiguous run, completing on two mbarriers (GEMM 1's
//   operands, then the up slice, which lands while GEMM 1 runs); 4 warps issue them.
// - GEMM 1 is split over the warps by column pairs and depth parts, added after one barrier.
// - bf16 on m16n8k16 with ldmatrix; fp32 in three TF32 passes, which keeps fp32's tolerance.
// Runs shapes whose operands fit one block's shared memory (the toy's widths) on sm_90, with
// d_model and rank multiples of 16, heads * head_dim of 8, 16-byte aligned tensors (mla_takes);
// the binding runs the others on step 7. Measurements and variants: kernels/08_bulk_mma.md.

#include <stdint.h>

#include "mla_common.cuh"
#include "mla_hopper.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTokens = 16;
constexpr int kMaxSplits = 8;
constexpr int kDownChunkBytes = 4096;      // w_down's bulk copies, spread over the issuing threads
constexpr int kIssuers = 128;              // threads that issue the bulk copies (one warp: 1 µs slower)
constexpr int kHiddenPad = 16, kUpPad = 16;  // bytes added to each shared row of hidden and of the up slice
constexpr int kSharedBudget = 227 * 1024;  // an sm_90 block's opt-in shared memory

struct Geometry {
  int64_t tokens;
  int d_model, rank, width;  // width = heads * head_dim, the columns of each up-projection
  int splits, slice;         // blocks per token tile; [k | v] columns per block
  int hidden_pitch, up_pitch, latent_pitch;  // elements per shared row
  int depth_parts;           // GEMM 1's depth split over warps
  int hidden_at, down_at, up_at, partials_at, latent_at, bytes;  // shared layout, bytes from the start
};

__host__ __device__ constexpr int align128(int64_t bytes) { return int(mla::round_up(bytes, 128)); }

// ---- bulk copies (they complete on mbarriers: mla_hopper.cuh) -------------------------------
__device__ __forceinline__ void bulk_copy(void* to, const void* from, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(mla::shared_address(to)), "l"(from), "r"(bytes), "r"(bar) : "memory");
}

// Stores a 16 x 8 accumulator tile at column n0 of a 16-row fp32 tile (rows g and g + 8,
// columns 2q and 2q + 1 of the tile: mma's layout).
__device__ __forceinline__ void store_accumulators(float* tile, int pitch, int n0, const float (&c)[4]) {
  const int g = threadIdx.x % 32 / 4, q = threadIdx.x % 4;
  float* at = tile + g * pitch + n0 + 2 * q;
  mla::store_whole<mla::Space::kShared>(at, make_uint2(__float_as_uint(c[0]), __float_as_uint(c[1])));
  mla::store_whole<mla::Space::kShared>(at + 8 * pitch, make_uint2(__float_as_uint(c[2]), __float_as_uint(c[3])));
}

// GEMM 1 for 16-column pair `pair` over depth steps [s0, s1): hidden (16 x d_model) times w_down.
__device__ __forceinline__ void gemm1_part(const __nv_bfloat16* hidden, const __nv_bfloat16* down,
                                           const Geometry& g, int pair, int s0, int s1, float (&c)[2][4]) {
  const int lane = threadIdx.x % 32;
  const __nv_bfloat16* a = hidden + (lane % 16) * g.hidden_pitch + (lane / 16) * 8;
  const __nv_bfloat16* b = down + (lane % 16) * g.rank + pair * 16 + (lane / 16) * 8;
  for (int s = s0; s < s1; ++s) {
    uint32_t af[4], bf[4];
    mla::ldmatrix_x4(af, a + s * 16);
    mla::ldmatrix_x4_trans(bf, b + s * 16 * g.rank);
    mla::mma_bf16(c[0], af, bf[0], bf[1]);
    mla::mma_bf16(c[1], af, bf[2], bf[3]);
  }
}
__device__ __forceinline__ void gemm1_part(const float* hidden, const float* down, const Geometry& g, int pair,
                                           int s0, int s1, float (&c)[2][4]) {
  const int gid = threadIdx.x % 32 / 4, q = threadIdx.x % 4;
  const float* a = hidden + gid * g.hidden_pitch + q;
  const float* b = down + q * g.rank + pair * 16 + gid;
  float small[2][4] = {};
  for (int s = s0; s < s1; ++s) {
    const int k = s * 8;
    const float af[4] = {a[k], a[k + 8 * g.hidden_pitch], a[k + 4], a[k + 8 * g.hidden_pitch + 4]};
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const float bf[2] = {b[k * g.rank + 8 * t], b[(k + 4) * g.rank + 8 * t]};
      mla::mma_3xtf32(c[t], small[t], af, bf);
    }
  }
  mla::add_into(c[0], small[0]);
  mla::add_into(c[1], small[1]);
}

// GEMM 2 for the 8-column tile at n0 of the slice: the latent (16 x rank, fp32) times the up slice.
__device__ __forceinline__ void gemm2_tile(const float* latent, const __nv_bfloat16* up, const Geometry& g, int n0,
                                           float (&c)[4]) {
  const int lane = threadIdx.x % 32, gid = lane / 4, q = lane % 4;
  const float* a = latent + gid * g.latent_pitch + 2 * q;
  const __nv_bfloat16* b = up + (lane % 16) * g.up_pitch + n0;
  for (int k = 0; k < g.rank; k += 16) {
    uint32_t af[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // rows gid, gid + 8; columns 2q, 2q + 8 (mma's A layout)
      const float2 pair = *reinterpret_cast<const float2*>(a + k + (i % 2) * 8 * g.latent_pitch + (i / 2) * 8);
      af[i] = mla::pack_bf16(pair.x, pair.y);
    }
    uint32_t bf[2];
    mla::ldmatrix_x2_trans(bf, b + k * g.up_pitch);
    mla::mma_bf16(c, af, bf[0], bf[1]);
  }
}
__device__ __forceinline__ void gemm2_tile(const float* latent, const float* up, const Geometry& g, int n0,
                                           float (&c)[4]) {
  const int gid = threadIdx.x % 32 / 4, q = threadIdx.x % 4;
  const float* a = latent + gid * g.latent_pitch + q;
  const float* b = up + q * g.up_pitch + n0 + gid;
  float small[4] = {};
  for (int k = 0; k < g.rank; k += 8) {
    const float af[4] = {a[k], a[k + 8 * g.latent_pitch], a[k + 4], a[k + 8 * g.latent_pitch + 4]};
    const float bf[2] = {b[k * g.up_pitch], b[(k + 4) * g.up_pitch]};
    mla::mma_3xtf32(c, small, af, bf);
  }
  mla::add_into(c, small);
}

__device__ __forceinline__ void store_pair(float* at, float x, float y) {
  mla::store_whole<mla::Space::kGlobal>(at, make_uint2(__float_as_uint(x), __float_as_uint(y)));
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* at, float x, float y) {
  *reinterpret_cast<uint32_t*>(at) = mla::pack_bf16(x, y);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    bulk_mma_kernel(const T* __restrict__ hidden, const T* __restrict__ w_down, const T* __restrict__ w_up_k,
                    const T* __restrict__ w_up_v, T* __restrict__ out, Geometry g) {
  extern __shared__ __align__(128) uint8_t shared[];
  T* const s_hidden = reinterpret_cast<T*>(shared + g.hidden_at);
  T* const s_down = reinterpret_cast<T*>(shared + g.down_at);
  T* const s_up = reinterpret_cast<T*>(shared + g.up_at);
  float* const s_partials = reinterpret_cast<float*>(shared + g.partials_at);  // GEMM 1's, by depth part
  float* const s_latent = reinterpret_cast<float*>(shared + g.latent_at);
  const uint32_t operands_landed = mla::shared_address(shared), up_landed = operands_landed + 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t token0 = int64_t(blockIdx.x / g.splits) * kTokens;
  const int rows = int(min(int64_t(kTokens), g.tokens - token0));
  const int column0 = int(blockIdx.x % g.splits) * g.slice;  // of [k | v]
  const T* const up_from = column0 < g.width ? w_up_k + column0 : w_up_v + (column0 - g.width);

  const uint32_t row_bytes = uint32_t(g.d_model) * sizeof(T);
  const uint32_t down_bytes = uint32_t(g.d_model) * uint32_t(g.rank) * sizeof(T);
  const uint32_t up_row_bytes = uint32_t(g.slice) * sizeof(T);
  if (threadIdx.x == 0) {
    // TODO(ex08): one thread sets up the block's two mbarriers (shared addresses operands_landed and up_landed): each waits for one arrival (mla::barrier_init), the inits are fenced so the copy engine sees them (fence.mbarrier_init.release.cluster), and each is told how many bytes its copies will bring (mla::barrier_expect_bytes): GEMM 1's operands are the block's `rows` rows of hidden plus all of w_down; the up slice is `rank` rows of up_row_bytes. A barrier completes when its byte count reaches zero, so these counts must equal what the copies below deliver
    MLA_NOT_IMPLEMENTED();
  }
  __syncthreads();
  // The copies: hidden rows, w_down's chunks, the up slice's rows; rows that are adjacent both in
  // shared and in global memory go as one copy.
  const bool hidden_whole = g.hidden_pitch == g.d_model;
  const bool up_whole = g.up_pitch == g.slice && g.slice == g.width;
  const int hidden_copies = hidden_whole ? 1 : rows;
  const int down_copies = int(mla::ceil_div(down_bytes, kDownChunkBytes));
  const int copies = hidden_copies + down_copies + (up_whole ? 1 : g.rank);
  for (int c = threadIdx.x; threadIdx.x < kIssuers && c < copies; c += kIssuers) {
    // TODO(ex08): issue copy number c with bulk_copy(to, from, bytes, barrier). Copies 0 .. hidden_copies - 1 are hidden's rows (all of them in one copy when hidden_whole), to s_hidden at hidden_pitch elements a row, completing on operands_landed; the next down_copies are w_down in kDownChunkBytes chunks (the last one shorter), also on operands_landed; the rest are the up slice's rows from up_from (width elements apart in global memory, up_pitch in shared; one copy when up_whole), completing on up_landed
    MLA_NOT_IMPLEMENTED();
  }
  // While the copies fly: zero the hidden rows past the last token (so that their results, never
  // stored, are finite).
  for (int i = rows * g.hidden_pitch + threadIdx.x; i < kTokens * g.hidden_pitch; i += kThreads) {
    s_hidden[i] = mla::from_float<T>(0.0f);
  }
  __syncthreads();
  // TODO(ex08): every thread waits until GEMM 1's operands have landed (phase 0 of operands_landed)
  MLA_NOT_IMPLEMENTED();

  constexpr int kStep = sizeof(T) == 2 ? 16 : 8;  // mma's depth
  const int pairs = g.rank / 16, steps = g.d_model / kStep;
  const int slab = kTokens * g.latent_pitch;  // floats of one 16-row fp32 tile
  for (int item = warp; item < pairs * g.depth_parts; item += kWarps) {
    const int pair = item % pairs, part = item / pairs;
    float c[2][4] = {};
    gemm1_part(s_hidden, s_down, g, pair, part * steps / g.depth_parts, (part + 1) * steps / g.depth_parts, c);
    store_accumulators(s_partials + part * slab, g.latent_pitch, pair * 16, c[0]);
    store_accumulators(s_partials + part * slab, g.latent_pitch, pair * 16 + 8, c[1]);
  }
  __syncthreads();
  const int quads = g.rank / 4;
  for (int i = threadIdx.x; i < kTokens * quads; i += kThreads) {
    const int at = i / quads * g.latent_pitch + i % quads * 4;
    float4 sum = *reinterpret_cast<const float4*>(s_partials + at);
    for (int part = 1; part < g.depth_parts; ++part) {
      const float4 more = *reinterpret_cast<const float4*>(s_partials + part * slab + at);
      sum.x += more.x, sum.y += more.y, sum.z += more.z, sum.w += more.w;
    }
    *reinterpret_cast<float4*>(s_latent + at) = sum;
  }
  __syncthreads();
  // TODO(ex08): and, before GEMM 2, until the up slice has (phase 0 of up_landed); it flew while GEMM 1 ran
  MLA_NOT_IMPLEMENTED();

  const int gid = lane / 4, q = lane % 4;
  for (int n0 = warp * 8; n0 < g.slice; n0 += kWarps * 8) {
    float c[4] = {};
    gemm2_tile(s_latent, s_up, g, n0, c);
    T* const row = out + (token0 + gid) * 2 * g.width + column0 + n0 + 2 * q;
    if (gid < rows) store_pair(row, c[0], c[1]);
    if (gid + 8 < rows) store_pair(row + 8 * 2 * g.width, c[2], c[3]);
  }
}

// Whether the kernel takes the problem's sizes and pointers (shared memory aside).
bool takes(const MlaProblem& p) {
  return p.d_model % 16 == 0 && p.rank % 16 == 0 && (p.heads * p.head_dim) % 8 == 0 &&
         mla::aligned16(p.hidden) && mla::aligned16(p.w_down) && mla::aligned16(p.w_up_k) &&
         mla::aligned16(p.w_up_v) && mla::aligned16(p.out);
}

// The shared layout for `splits` blocks per token tile.
Geometry layout(const MlaProblem& p, int element_bytes, int splits) {
  Geometry g;
  g.tokens = p.tokens, g.d_model = int(p.d_model), g.rank = int(p.rank), g.width = int(p.heads * p.head_dim);
  g.splits = splits;
  g.slice = 2 * g.width / splits;
  g.hidden_pitch = g.d_model + kHiddenPad / element_bytes;
  g.up_pitch = g.slice + kUpPad / element_bytes;
  g.latent_pitch = g.rank + (element_bytes == 2 ? 8 : 4);
  const int pairs = g.rank / 16, steps = g.d_model / (element_bytes == 2 ? 16 : 8);
  g.depth_parts = pairs >= kWarps ? 1 : (kWarps / pairs < steps ? kWarps / pairs : steps);
  g.hidden_at = 128;
  g.down_at = g.hidden_at + align128(int64_t(kTokens) * g.hidden_pitch * element_bytes);
  g.up_at = g.down_at + align128(int64_t(g.d_model) * g.rank * element_bytes);
  g.partials_at = g.up_at + align128(int64_t(g.rank) * g.up_pitch * element_bytes);
  g.latent_at = g.partials_at + align128(int64_t(g.depth_parts) * kTokens * g.latent_pitch * 4);
  g.bytes = g.latent_at + kTokens * g.latent_pitch * 4;
  return g;
}

// The plan for a problem the kernel takes, or false when its operands do not fit kSharedBudget.
// The test is on 2 splits, the widest up slice, so that it does not depend on the number of
// tokens (more splits only narrow the slice).
bool plan(const MlaProblem& p, int element_bytes, Geometry* out) {
  if (layout(p, element_bytes, 2).bytes > kSharedBudget) return false;
  // Splits: an even count (a slice never straddles k and v) whose slice is whole 8-column tiles
  // (2 always is, as heads * head_dim is a multiple of 8); the most that still fit one wave.
  const int64_t tiles = mla::ceil_div(p.tokens, kTokens);
  int splits = 2;
  for (int s = 4; s <= kMaxSplits; s += 2) {
    if ((2 * p.heads * p.head_dim) % (8 * s) == 0 && tiles * s <= mla::multiprocessor_count()) {
      splits = s;
    }
  }
  *out = layout(p, element_bytes, splits);
  return true;
}

bool takes_with_plan(const MlaProblem& p, int element_bytes, Geometry* g) {
  return mla::on_hopper() && takes(p) && plan(p, element_bytes, g);
}

template <typename T>
cudaError_t launch(const MlaProblem& p, cudaStream_t stream) {
  Geometry g;
  if (!takes_with_plan(p, sizeof(T), &g)) return cudaErrorNotSupported;  // the binding runs step 7 for these
  cudaError_t err = mla::allow_shared_memory(bulk_mma_kernel<T>, g.bytes);
  if (err != cudaSuccess) return err;
  const unsigned blocks = unsigned(mla::ceil_div(p.tokens, kTokens) * g.splits);
  bulk_mma_kernel<T><<<blocks, kThreads, g.bytes, stream>>>(
      static_cast<const T*>(p.hidden), static_cast<const T*>(p.w_down), static_cast<const T*>(p.w_up_k),
      static_cast<const T*>(p.w_up_v), static_cast<T*>(p.out), g);
  return cudaGetLastError();
}

}  // namespace

MLA_DEFINE_LAUNCHER(launch)

extern "C" int mla_takes(const MlaProblem* p) {
  Geometry g;
  return takes_with_plan(*p, p->dtype == MLA_FLOAT32 ? 4 : 2, &g);
}
