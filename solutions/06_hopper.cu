// Step 6 — Hopper: wgmma fed by TMA, and a cluster of blocks sharing one latent tile.
//
// What changed from step 5, and why: mma.sync's warp-wide 16 x 8 products leave Hopper's tensor
// cores waiting on registers and on the threads that load them, and step 5 recomputes the latent
// in every column split.
// - wgmma: a warpgroup multiplies a 64 x 128 tile per instruction from shared memory.
// - TMA: one thread copies a whole 128-byte-swizzled box, completing on an mbarrier; a producer
//   warpgroup keeps a ring full while two consumer warpgroups compute (ping-pong in GEMM 2).
// - A cluster of up to 4 blocks shares a 128-token tile: each computes part of the latent and
//   copies it into the others' shared memory; groups of clusters split GEMM 1 through global
//   memory when the whole grid is resident, for a few tokens along d_model too (fp32 sums), so
//   that no block streams all of w_down alone.
// Runs bf16 on sm_90 with d_model, rank multiples of 8, heads * head_dim of 64, rank <= 512 and
// 16-byte aligned tensors (mla_takes); the binding runs everything else on step 5.
// Measurements and the variants not kept: kernels/06_hopper.md.
#include <stdint.h>

#include <type_traits>

#include "mla_common.cuh"
#include "mla_hopper.cuh"

namespace {

using mla::barrier_arrive, mla::barrier_expect_bytes, mla::barrier_init, mla::barrier_wait, mla::descriptor,
    mla::fence_registers, mla::tma_load, mla::wgmma_commit, mla::wgmma_fence, mla::wgmma_wait;

constexpr int kTokens = 128;          // tokens per block: 64 rows for each consumer warpgroup
constexpr int kColumns = 128;         // columns of one wgmma tile (latent or output)
constexpr int kRowBytes = 128;        // one swizzled row: 64 bf16
constexpr int kChunk = kRowBytes / 2; // K elements per swizzled row
constexpr int kStages = 3;
constexpr int kStageBytes = 32 * 1024;
constexpr int kMaxRank = 512;
// GEMM 1's ring also runs through the latent tile, which is written only once GEMM 1 is done:
// 7 slots in flight instead of 3. A block holds its latent slice in registers (as bf16 pairs)
// until every block of its cluster is done with GEMM 1 (a cluster barrier): at most kHeldPasses
// latent tiles, so the launcher gives no block more passes than that.
constexpr int kLatentBytes = kTokens * kMaxRank * 2;
constexpr int kGemm1Depth = kStages + kLatentBytes / kStageBytes;
constexpr int kHeldPasses = 2;
constexpr int kMaxCluster = 4;
constexpr int kThreads = 3 * 128;     // warpgroup 0 loads, warpgroups 1 and 2 compute
constexpr int kConsumerWarps = 8;
// GEMM 1 slot: the hidden box (128 tokens x 64 K), then w_down as two 64 K x 64 column boxes.
// GEMM 2 slot: [w_up_k | w_up_v] as two 128 K x 64 column boxes.
constexpr int kHiddenBytes = kTokens * kRowBytes;
constexpr int kDownBoxBytes = kChunk * kRowBytes;
constexpr int kUpDepth = 128;
constexpr int kUpBoxBytes = kUpDepth * kRowBytes;
constexpr int kLatentChunkBytes = kTokens * kRowBytes;  // 64 latent columns of all 128 tokens
constexpr int kLatentTileBytes = 2 * kLatentChunkBytes;  // one GEMM 1 pass: 128 latent columns
// The mbarriers after the latent tile, by index (8 bytes each): each ring's full and empty
// barriers, GEMM 2's two turns ("consumer c may run GEMM 2 slots"), one for the other groups'
// latent tiles, one for those of this cluster's blocks, and one that every consumer warp of the
// cluster arrives on once its GEMM 1 is done.
constexpr int kDownFull = 0, kDownEmpty = kDownFull + kGemm1Depth;
constexpr int kUpFull = kDownEmpty + kGemm1Depth, kUpEmpty = kUpFull + kStages;
constexpr int kTurns = kUpEmpty + kStages, kLatentLoaded = kTurns + 2, kLatentFromCluster = kLatentLoaded + 1;
constexpr int kClusterDoneWithGemm1 = kLatentFromCluster + 1;
constexpr int kBarriers = kClusterDoneWithGemm1 + 1;

struct Shapes {
  int64_t tokens, d_model, rank, width;
  int passes;   // 128-column latent tiles per block: its slice of GEMM 1
  int groups;   // clusters per token tile, each owning every groups-th set of output tiles
  // The groups of a token tile either each compute the whole latent (exchange == 0), or split it
  // and exchange their slices through `scratch` in global memory, `ready` counting the writers.
  int exchange;
  int latent_tiles;  // scratch rows hold latent_tiles * kColumns columns
  // With splits > 1 (clusters of one block), `splits` blocks share each latent tile, each summing
  // split_chunks 64-deep chunks of d_model into `sums` (fp32, laid out as scratch); `arrivals`
  // counts them per latent tile, and the last to arrive writes the tile's bf16 scratch.
  int splits, split_chunks;
  __nv_bfloat16* scratch;
  unsigned* ready;
  unsigned* arrivals;
  float* sums;
};

// ---- the cluster ---------------------------------------------------------------------------
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_size() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// Arrives on the mbarrier at the offset of `bar` in every block of the cluster, releasing this
// thread's earlier accesses (and those its warp ordered before it) to the whole cluster.
__device__ __forceinline__ void arrive_in_every_block(uint32_t bar, uint32_t blocks) {
  for (uint32_t r = 0; r < blocks; ++r) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(r));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
  }
}
// Copies `bytes` of this block's shared memory at `local` to the same offset in block `rank` of
// the cluster, completing on that block's mbarrier at the offset of `bar` (one bulk copy: 4-byte
// stores into another block took 7.5 µs per 32 KB latent tile at V2-Lite, kernels/06_hopper.md).
__device__ __forceinline__ void copy_to_block(uint32_t local, uint32_t rank, uint32_t bytes, uint32_t bar) {
  uint32_t remote, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"(bar), "r"(rank));
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(remote), "r"(local), "r"(bytes), "r"(remote_bar) : "memory");
}

// ---- one token tile's groups, through global memory ----------------------------------------
__device__ __forceinline__ void count_writer(unsigned* counter) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}
// Adds 1 to `counter` and returns whether this was the arrival that brought it to `arrivals`;
// acquires what the earlier arrivals released.
__device__ __forceinline__ bool last_to_arrive(unsigned* counter, unsigned arrivals) {
  unsigned before;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
  return before + 1 == arrivals;
}
__device__ __forceinline__ void wait_for_writers(const unsigned* counter, unsigned writers) {
  unsigned seen = 0;
  while (true) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (seen >= writers) break;
    __nanosleep(64);
  }
}

// ---- wgmma (descriptors and fences: mla_hopper.cuh) ---------------------------------------
using Accumulator = float[64];  // this thread's share of a 64 x 128 fp32 tile

#define MLA_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                    "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
// d += A (64 x 16, K-major) @ B (16 x 128, MN-major: the trailing 1 transposes B).
__device__ __forceinline__ void wgmma_64x128x16(Accumulator& d, uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, accumulate, 1, 1, 0, 1;\n}\n"
      : MLA_ACC8(0), MLA_ACC8(8), MLA_ACC8(16), MLA_ACC8(24), MLA_ACC8(32), MLA_ACC8(40),
        MLA_ACC8(48), MLA_ACC8(56)
      : "l"(a), "l"(b), "r"(1));
}
#undef MLA_ACC8

// Calls f(row, column, pair_index) for this thread's result pairs: wgmma's accumulator layout,
// (row, column) and (row, column + 1) in d[2 * pair_index], d[2 * pair_index + 1].
template <class F>
__device__ __forceinline__ void for_each_pair(F f) {
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kColumns / 8; ++i) {
    const int row = warp * 16 + lane / 4, column = 8 * i + lane % 4 * 2;
    f(row, column, 2 * i);
    f(row + 8, column, 2 * i + 1);
  }
}

// This thread's share of a 64 x 128 tile as bf16 pairs: pairs[p] holds acc[2p] and acc[2p + 1].
using Pairs = uint32_t[kColumns / 4];
__device__ __forceinline__ void pack_pairs(const Accumulator& acc, Pairs& pairs) {
#pragma unroll
  for (int p = 0; p < kColumns / 4; ++p) pairs[p] = mla::pack_bf16(acc[2 * p], acc[2 * p + 1]);
}

// Stores this warpgroup's 64 x 128 tile (as `pairs`) in rows first_token.. of `out` (rows of
// `columns` elements, the tile at column0), 16 bytes per thread per store. wgmma leaves each row's
// 256 bytes spread over the 4 threads of a quad, 4 bytes per (row, 8-column group); a 4 x 4
// transpose inside the quad (two rounds of shuffles) gives each thread a whole group, so a warp's
// store covers 64 contiguous bytes of 8 rows instead of 16 bytes of 8 rows (the measurement is in
// kernels/06_hopper.md). GEMM 2 stores its output tiles with it, and GEMM 1 its latent slices into
// the exchange's scratch buffer.
__device__ __forceinline__ void store_tile(const Pairs& pairs, __nv_bfloat16* __restrict__ out,
                                           int64_t first_token, int64_t tokens, int64_t columns,
                                           int64_t column0) {
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, quad_lane = lane % 4;
  const bool odd = quad_lane & 1, upper_half = quad_lane & 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // rows lane / 4 and lane / 4 + 8 of the warp's 16
    const int64_t token = first_token + warp * 16 + lane / 4 + 8 * half;
#pragma unroll
    for (int group = 0; group < 4; ++group) {  // groups 4 * group .. + 3 of 8 columns
      uint32_t v[4];  // v[k]: columns 8 * (4 * group + k) + 2 * quad_lane, + 1
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = pairs[2 * (4 * group + k) + half];
      // Quad lanes q and q ^ 2 swap the off-diagonal 2 x 2 blocks, then q and q ^ 1 transpose
      // each block: afterwards v[m] holds columns 8 * (4 * group + quad_lane) + 2 * m, + 1.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t got = __shfl_xor_sync(0xffffffffu, upper_half ? v[j] : v[j + 2], 2);
        if (upper_half) v[j] = got; else v[j + 2] = got;
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? v[2 * j] : v[2 * j + 1], 1);
        if (odd) v[2 * j] = got; else v[2 * j + 1] = got;
      }
      if (token < tokens) {
        mla::store_whole<mla::Space::kGlobal>(out + token * columns + column0 + 8 * (4 * group + quad_lane),
                                              make_uint4(v[0], v[1], v[2], v[3]));
      }
    }
  }
}
__device__ __forceinline__ void store_tile(const Accumulator& acc, __nv_bfloat16* __restrict__ out,
                                           int64_t first_token, int64_t tokens, int64_t columns,
                                           int64_t column0) {
  Pairs pairs;
  pack_pairs(acc, pairs);
  store_tile(pairs, out, first_token, tokens, columns, column0);
}

// Adds this warpgroup's 64 x 128 tile to rows first_token.. of `sums` (tokens past the last left
// out), a pair of fp32 reductions at a time.
__device__ __forceinline__ void add_to_sums(const Accumulator& acc, float* __restrict__ sums, int64_t first_token,
                                            int64_t tokens, int64_t columns, int64_t column0) {
  for_each_pair([&](int row, int column, int pair) {
    if (first_token + row < tokens) {
      float* at = sums + (first_token + row) * columns + column0 + column;
      asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};" ::"l"(at), "f"(acc[2 * pair]),
                   "f"(acc[2 * pair + 1]) : "memory");
    }
  });
}

// The consumers (256 threads) round one 128 x 128 tile of `sums` to bf16 in `scratch` (same
// layout), 8 columns per load and store; rows past the last token are written as zeros. Every
// load is issued before the first store: a store (asm with a memory clobber) would hold the next
// unit's loads behind it, one L2 round trip per unit on the way to the latent.
__device__ __forceinline__ void round_sums(const float* __restrict__ sums, __nv_bfloat16* __restrict__ scratch,
                                           int64_t first_token, int64_t tokens, int64_t columns,
                                           int64_t column0) {
  constexpr int kUnitsPerRow = kColumns / 8, kUnits = kTokens * kUnitsPerRow / 256;
  auto at = [&](int i) {
    const int unit = threadIdx.x - 128 + 256 * i;
    return (first_token + unit / kUnitsPerRow) * columns + column0 + unit % kUnitsPerRow * 8;
  };
  auto has_token = [&](int i) { return first_token + (threadIdx.x - 128 + 256 * i) / kUnitsPerRow < tokens; };
  float4 lo[kUnits], hi[kUnits];
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    lo[i] = hi[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (has_token(i)) {
      lo[i] = __ldcg(reinterpret_cast<const float4*>(sums + at(i)));
      hi[i] = __ldcg(reinterpret_cast<const float4*>(sums + at(i) + 4));
    }
  }
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    mla::store_whole<mla::Space::kGlobal>(scratch + at(i),
                                          make_uint4(mla::pack_bf16(lo[i].x, lo[i].y), mla::pack_bf16(lo[i].z, lo[i].w),
                                                     mla::pack_bf16(hi[i].x, hi[i].y), mla::pack_bf16(hi[i].z, hi[i].w)));
  }
}

// Byte offset of latent element (row, column) in the K-major, 128-byte swizzled tile: 64-column
// chunks of 128 rows, and within a row the 16-byte units permuted by row % 8 (what TMA does to
// the hidden tile, so both GEMMs read their A operand the same way).
__device__ __forceinline__ uint32_t latent_offset(int row, int column) {
  const int unit = column % kChunk / 8;
  return column / kChunk * kLatentChunkBytes + row * kRowBytes + ((unit ^ row % 8) * 16) + column % 8 * 2;
}

// A ring of `depth` slots: the producer fills slot `it % depth`, the consumers drain it.
struct Ring {
  uint32_t slots, full, empty;  // shared addresses: slot 0, then `depth` mbarriers each
  int depth;
  __device__ uint32_t slot(int it) const { return slots + it % depth * kStageBytes; }
  __device__ uint32_t full_bar(int it) const { return full + it % depth * 8; }
  __device__ uint32_t empty_bar(int it) const { return empty + it % depth * 8; }
  __device__ uint32_t parity(int it) const { return it / depth & 1; }
};

__global__ void __launch_bounds__(kThreads, 1)
    hopper_kernel(const __grid_constant__ CUtensorMap hidden_map,
                  const __grid_constant__ CUtensorMap down_map,
                  const __grid_constant__ CUtensorMap up_k_map,
                  const __grid_constant__ CUtensorMap up_v_map,
                  const __grid_constant__ CUtensorMap scratch_map, __nv_bfloat16* __restrict__ out,
                  Shapes s) {
  extern __shared__ uint8_t shared_raw[];
  // The swizzle is a function of address bits 4-9: every slot and chunk starts 1024-aligned.
  // [kStages slots | latent tile | mbarriers]: GEMM 1's ring is every slot and the latent tile,
  // GEMM 2's the kStages slots alone; each ring has its own mbarriers.
  const uint32_t base = (mla::shared_address(shared_raw) + 1023) & ~1023u;
  const uint32_t latent = base + kStages * kStageBytes;
  auto barrier = [latent](int index) { return latent + kLatentBytes + 8 * index; };
  const Ring down_ring{base, barrier(kDownFull), barrier(kDownEmpty), kGemm1Depth};
  const Ring up_ring{base, barrier(kUpFull), barrier(kUpEmpty), kStages};
  const uint32_t turn = barrier(kTurns);
  const uint32_t latent_loaded = barrier(kLatentLoaded);
  const uint32_t latent_from_cluster = barrier(kLatentFromCluster);
  const uint32_t cluster_done_with_gemm1 = barrier(kClusterDoneWithGemm1);

  const uint32_t rank = cluster_rank(), blocks = cluster_size();
  const int64_t cluster = blockIdx.x / blocks;
  const int64_t token0 = cluster / s.groups * kTokens;
  const int group = int(cluster % s.groups);
  const int64_t columns = 2 * s.width;
  const int output_tiles = int(columns / kColumns);  // width % 64 == 0, so no partial tile
  const int first_tile = group * int(blocks) + int(rank), tile_step = s.groups * int(blocks);
  const int down_chunks = int(mla::ceil_div(s.d_model, kChunk));
  const bool split = s.splits > 1;
  const int up_stages = int(mla::ceil_div(s.rank, kUpDepth));
  // Block r of the cluster computes latent tiles owner(r) * s.passes .. (adjacent owners).
  auto first_latent_tile_of = [&](uint32_t r) { return (s.exchange ? group * int(blocks) + int(r) : int(r)) * s.passes; };
  auto passes_of = [&](uint32_t r) { return max(0, min(s.passes, s.latent_tiles - first_latent_tile_of(r))); };
  // Split along d_model, group g sums chunks of latent tile g / splits (part g % splits).
  const int first_latent_tile = split ? group / s.splits : first_latent_tile_of(rank);
  const int first_chunk = split ? group % s.splits * s.split_chunks : 0;
  const int chunks = split ? max(0, min(s.split_chunks, down_chunks - first_chunk)) : down_chunks;
  const int passes = split ? int(first_latent_tile < s.latent_tiles && chunks > 0) : passes_of(rank);
  const int64_t token_tile = token0 / kTokens;

  if (threadIdx.x == 0) {
    for (const Ring* ring : {&down_ring, &up_ring}) {
      for (int i = 0; i < ring->depth; ++i) {
        barrier_init(ring->full + 8 * i, 1);
        barrier_init(ring->empty + 8 * i, kConsumerWarps);
      }
    }
    for (int i = 0; i < 2; ++i) barrier_init(turn + 8 * i, 4);
    barrier_init(latent_loaded, 1);
    barrier_init(latent_from_cluster, 1);
    barrier_init(cluster_done_with_gemm1, blocks * kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    uint32_t from_cluster = 0;
    for (uint32_t r = 0; r < blocks; ++r) from_cluster += r == rank ? 0 : passes_of(r) * kLatentTileBytes;
    barrier_expect_bytes(latent_from_cluster, from_cluster);
  }
  // Every block of the cluster has started and initialized its barriers before any block
  // writes into another's shared memory.
  cluster_sync();

  if (threadIdx.x < 128) {  // producer warpgroup: one thread issues every copy
    if (threadIdx.x == 0) {
      auto acquire = [](const Ring& ring, int it, uint32_t bytes) {
        barrier_wait(ring.empty_bar(it), ring.parity(it) ^ 1);
        barrier_expect_bytes(ring.full_bar(it), bytes);
      };
      const int gemm1_slots = passes * chunks;
      for (int it = 0; it < gemm1_slots; ++it) {
        const int pass = it / chunks, chunk = first_chunk + it % chunks;
        const int column0 = (first_latent_tile + pass) * kColumns;
        acquire(down_ring, it, kStageBytes);
        tma_load(down_ring.slot(it), hidden_map, chunk * kChunk, int(token0), down_ring.full_bar(it));
        for (int half = 0; half < 2; ++half) {
          tma_load(down_ring.slot(it) + kHiddenBytes + half * kDownBoxBytes, down_map,
                   column0 + half * kChunk, chunk * kChunk, down_ring.full_bar(it));
        }
      }
      // GEMM 2's first kStages fills go into slots GEMM 1 used: each waits until GEMM 1's last use
      // of its slot is drained. They are issued before the exchange's wait, so that w_up's first
      // slots land while the other groups finish their latent slices.
      const int up_slots = int(mla::ceil_div(output_tiles - first_tile, tile_step)) * up_stages;
      auto fill_up_slot = [&](int it) {
        if (it < gemm1_slots && it < kStages) {
          const int last_use = it + (gemm1_slots - 1 - it) / kGemm1Depth * kGemm1Depth;
          barrier_wait(down_ring.empty_bar(last_use), down_ring.parity(last_use));
        }
        const int tile = first_tile + it / up_stages * tile_step, depth = it % up_stages;
        acquire(up_ring, it, kStageBytes);
        for (int half = 0; half < 2; ++half) {
          const int64_t column = int64_t(tile) * kColumns + half * kChunk;
          const bool is_k = column < s.width;
          tma_load(up_ring.slot(it) + half * kUpBoxBytes, is_k ? up_k_map : up_v_map,
                   int(is_k ? column : column - s.width), depth * kUpDepth, up_ring.full_bar(it));
        }
      };
      const int early_up_slots = min(up_slots, kStages);
      for (int it = 0; it < early_up_slots; ++it) fill_up_slot(it);
      if (s.exchange) {  // once every group has written its slice, fetch the other clusters' tiles
        // (split along d_model: every tile, once its last part has rounded it)
        wait_for_writers(s.ready + token_tile, split ? unsigned(s.latent_tiles) : unsigned(s.groups) * blocks);
        asm volatile("fence.proxy.async.global;" ::: "memory");  // generic writes, TMA reads
        auto foreign = [&](int t) { return split || t / s.passes / int(blocks) != group; };  // another group's
        int foreign_tiles = 0;
        for (int t = 0; t < s.latent_tiles; ++t) foreign_tiles += foreign(t);
        barrier_expect_bytes(latent_loaded, uint32_t(foreign_tiles) * 2 * kLatentChunkBytes);
        for (int t = 0; t < s.latent_tiles; ++t) {
          if (!foreign(t)) continue;
          for (int half = 0; half < 2; ++half) {
            tma_load(latent + (2 * t + half) * kLatentChunkBytes, scratch_map, (2 * t + half) * kChunk,
                     int(token0), latent_loaded);
          }
        }
      }
      for (int it = early_up_slots; it < up_slots; ++it) fill_up_slot(it);
    }
    return;
  }

  // Consumer warpgroups 1 and 2.
  const int consumer = threadIdx.x / 128 - 1;
  const bool warp_leader = threadIdx.x % 32 == 0;
  // Runs ring slots first .. first + slots - 1 through the tensor cores; `issue(slot_address, n)`
  // issues the n-th one's wgmmas, and `after_last_wait()` runs once the last slot has landed.
  // With one_in_flight false, a slot is handed back as soon as its wgmmas finish, so the producer
  // refills it at once; with true, the next slot's wgmmas are issued before waiting for this
  // one's, so the tensor cores never drain between slots, and slots go back one behind. GEMM 1,
  // which both warpgroups run together and which waits on L2, is faster with the first; GEMM 2,
  // one warpgroup at a time, with the second (A/B on the H200: kernels/06_hopper.md).
  // Each slot's empty barrier expects 8 arrivals: one per consumer warp when both warpgroups read
  // the slot, two per warp when only this warpgroup does.
  auto run_slots = [&](const Ring& ring, int first, int slots, uint32_t arrivals_per_warp, auto one_in_flight,
                       auto issue, auto after_last_wait) {
    // BEGIN SOLUTION: the consumer's side of the ring, slot `it` = first + n for n = 0 .. slots - 1. The goal: run issue(slot address, n) on every slot once its copies have landed, and hand each slot back to the producer as soon as no wgmma reads it. The invariants: a slot's copies have landed when its full barrier completes the ring's phase for `it` (ring.parity); wgmma may read the accumulators only after a wgmma_fence, and the wgmmas of one slot are one commit group; a slot is handed back by one arrival of arrivals_per_warp from each warp's leader on its empty barrier; call after_last_wait() once the last slot has landed, before its wgmmas. With one_in_flight, one group stays in flight (wait until at most one is pending) and the slot handed back is the one before, the last after the loop; without it, wait for every group and hand back this slot. A slot never handed back stalls the producer, and the kernel never returns (restart the notebook kernel)
    // HINT 1: A ring of slots between one producer and two consumers: each slot has a full barrier (the copy landed) and an empty barrier (the consumers are done). The consumer waits on full, computes, and arrives on empty.
    // HINT 2: for n < slots: it = first + n; barrier_wait(full_bar(it), parity(it)); last slot: after_last_wait(); wgmma_fence(); issue(slot(it), n); wgmma_commit(); then wgmma_wait<0> and arrive on empty_bar(it), or with one_in_flight wgmma_wait<1> and arrive on empty_bar(it - 1) (n > 0), the last slot after the loop.
    for (int n = 0; n < slots; ++n) {
      const int it = first + n;
      barrier_wait(ring.full_bar(it), ring.parity(it));
      if (n == slots - 1) after_last_wait();
      wgmma_fence();
      issue(ring.slot(it), n);
      wgmma_commit();
      if constexpr (decltype(one_in_flight)::value) {
        wgmma_wait<1>();
        if (n > 0 && warp_leader) barrier_arrive(ring.empty_bar(it - 1), arrivals_per_warp);
      } else {
        wgmma_wait<0>();
        if (warp_leader) barrier_arrive(ring.empty_bar(it), arrivals_per_warp);
      }
    }
    if constexpr (decltype(one_in_flight)::value) {
      wgmma_wait<0>();
      if (warp_leader) barrier_arrive(ring.empty_bar(first + slots - 1), arrivals_per_warp);
    }
    // END SOLUTION
  };
  auto zero = [](Accumulator& acc) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    fence_registers(acc);
  };

  // GEMM 1, both warpgroups on each slot (rows 64 * consumer ..): this block's latent columns,
  // kept in registers as bf16 pairs (and written to the scratch buffer for the other groups)
  // until every block of the cluster is done with its latent tile as ring slots, then written
  // into this block's latent tile and copied into the other blocks'.
  Pairs latent_pairs[kHeldPasses];
#pragma unroll
  for (int pass = 0; pass < kHeldPasses; ++pass) {
    if (pass >= passes) break;
    Accumulator acc;
    zero(acc);
    run_slots(down_ring, pass * chunks, chunks, 1, std::false_type{}, [&](uint32_t slot, int) {
      // BEGIN SOLUTION: GEMM 1 on one slot: one wgmma_64x128x16 into acc per 16 depths of the slot's kChunk. The invariants: the slot holds the block's hidden rows first (one row of kRowBytes per token, 128-byte swizzled; this consumer's 64 rows start consumer * 64 rows in), then after kHiddenBytes w_down's box (one row of kRowBytes per depth). A descriptor (descriptor(start, leading byte offset, stride byte offset)) of these swizzled tiles strides 1024 bytes from one 8-row group to the next; B's leading byte offset is the box's size, kDownBoxBytes, A's is 16 (unused under the swizzle). 16 depths are 32 bytes along a hidden row, but 16 rows down w_down's box
      // HINT 1: wgmma reads both operands from shared memory through descriptors; advancing along the depth means moving each descriptor's start address, differently for the K-major A (along a row) and the N-major B (down the rows).
      // HINT 2: for k < kChunk / 16: wgmma_64x128x16(acc, descriptor(slot + consumer * 64 * kRowBytes + 32 * k, 16, 1024), descriptor(slot + kHiddenBytes + 16 * kRowBytes * k, kDownBoxBytes, 1024)).
#pragma unroll
      for (int k = 0; k < kChunk / 16; ++k) {
        wgmma_64x128x16(acc, descriptor(slot + consumer * 64 * kRowBytes + 32 * k, 16, 1024),
                        descriptor(slot + kHiddenBytes + 16 * kRowBytes * k, kDownBoxBytes, 1024));
      }
      // END SOLUTION
    }, [] {});
    fence_registers(acc);
    if (split) {
      add_to_sums(acc, s.sums, token0 + consumer * 64, s.tokens, int64_t(s.latent_tiles) * kColumns,
                  first_latent_tile * kColumns);
      break;
    }
    pack_pairs(acc, latent_pairs[pass]);
    if (s.exchange) {
      const int64_t scratch_columns = int64_t(s.latent_tiles) * kColumns;
      store_tile(latent_pairs[pass], s.scratch, token0 + consumer * 64, token0 + kTokens, scratch_columns,
                 (first_latent_tile + pass) * kColumns);
    }
  }
  if (split) {  // this block's part is in `sums`: count it; the last part rounds the tile
    __threadfence();
    uint32_t last = 0;
    asm volatile("bar.sync 1, 256;" ::: "memory");
    if (threadIdx.x == 128 && passes > 0) {
      last = last_to_arrive(s.arrivals + token_tile * s.latent_tiles + first_latent_tile, unsigned(s.splits));
    }
    asm volatile("{\n.reg .pred mine, any;\nsetp.ne.u32 mine, %1, 0;\nbar.red.or.pred any, 1, 256, mine;\n"
                 "selp.u32 %0, 1, 0, any;\n}\n" : "=r"(last) : "r"(last) : "memory");
    if (last) {
      const int64_t scratch_columns = int64_t(s.latent_tiles) * kColumns;
      round_sums(s.sums, s.scratch, token0, s.tokens, scratch_columns, first_latent_tile * kColumns);
      __threadfence();
      asm volatile("bar.sync 1, 256;" ::: "memory");
      if (threadIdx.x == 128) count_writer(s.ready + token_tile);
    }
  } else if (s.exchange) {  // this block's slice is in global memory: count it, once all 256 threads wrote
    __threadfence();
    asm volatile("bar.sync 1, 256;" ::: "memory");
    if (threadIdx.x == 128) count_writer(s.ready + token_tile);
  }
  // Only once every block's GEMM 1 is done with its latent tile as ring slots may latent tiles be
  // written into it: each consumer warp tells every block of the cluster, then waits to be told.
  // (An mbarrier rather than a cluster barrier split around GEMM 1, which the producer would
  // have to arrive at before its copies: compute-sanitizer's racecheck and synccheck never
  // finished that kernel, kernels/06_hopper.md.)
  __syncwarp();
  if (warp_leader) arrive_in_every_block(cluster_done_with_gemm1, blocks);
  barrier_wait<mla::Scope::kCluster>(cluster_done_with_gemm1, 0);
  const int held_passes = split ? 0 : passes;
#pragma unroll
  for (int pass = 0; pass < kHeldPasses; ++pass) {
    if (pass >= held_passes) break;
    const int column0 = (first_latent_tile + pass) * kColumns;
    for_each_pair([&](int row, int column, int pair) {
      const uint32_t where = latent + latent_offset(consumer * 64 + row, column0 + column);
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(where), "r"(latent_pairs[pass][pair]) : "memory");
    });
  }
  // The slice reaches wgmma and the bulk copies (the async proxy) through ordinary stores: fence,
  // then barrier; then one thread copies it into the cluster's other blocks.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("bar.sync 1, 256;" ::: "memory");
  if (threadIdx.x == 128 && held_passes > 0) {
    for (uint32_t r = 0; r < blocks; ++r) {
      if (r != rank) {
        copy_to_block(latent + first_latent_tile * kLatentTileBytes, r, passes * kLatentTileBytes,
                      latent_from_cluster);
      }
    }
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  barrier_wait(latent_from_cluster, 0);
  if (s.exchange) barrier_wait(latent_loaded, 0);

  // GEMM 2: the latent tile (A, from shared memory) times [w_up_k | w_up_v], tile by tile, in
  // ping-pong: the warpgroups take alternate output tiles, each computing all 128 rows, so one
  // stores a finished tile while the other keeps the tensor cores busy. (Splitting every tile by
  // rows kept both warpgroups in step: the tensor cores idled while both stored.)
  //
  // The warpgroups take turns at the ring (turn barriers): a warpgroup waits on a slot's full
  // barrier only after the other has waited on every earlier slot. Without that, a warpgroup
  // could wait on a slot whose previous fill, meant for the other, had not landed yet: a parity
  // wait cannot tell those two fills apart and passes at once (found on the H200: a wrong v and a
  // hang, 2026-12-03).
  int turns = 0;  // how many times this warpgroup has waited for its turn
  for (int tile = first_tile, index = 0; tile < output_tiles; tile += tile_step, ++index) {
    if (index % 2 != consumer) continue;
    Accumulator upper, lower;  // token rows 0-63 and 64-127
    zero(upper);
    zero(lower);
    if (index > 0) barrier_wait(turn + 8 * consumer, turns++ & 1);
    // The other warpgroup's turn comes as soon as this one has waited on its last slot: its first
    // wgmmas then queue behind this one's last, with no gap for the tensor cores.
    auto pass_turn = [&] { if (warp_leader) barrier_arrive(turn + 8 * (1 - consumer), 1); };
    run_slots(up_ring, index * up_stages, up_stages, 2, std::true_type{}, [&](uint32_t slot, int depth) {
#pragma unroll
      for (int k = 0; k < kUpDepth / 16; ++k) {
        const int column = depth * kUpDepth + 16 * k;  // latent column = K of GEMM 2
        const uint64_t weights = descriptor(slot + 16 * kRowBytes * k, kUpBoxBytes, 1024);
        wgmma_64x128x16(upper, descriptor(latent + latent_offset(0, column), 16, 1024), weights);
        wgmma_64x128x16(lower, descriptor(latent + latent_offset(64, column), 16, 1024), weights);
      }
    }, pass_turn);
    fence_registers(upper);
    fence_registers(lower);
    const int64_t column0 = int64_t(tile) * kColumns;
    store_tile(upper, out, token0, s.tokens, columns, column0);
    store_tile(lower, out, token0 + 64, s.tokens, columns, column0);
  }
  // This block's shared memory must outlive the copies that read it.
  if (threadIdx.x == 128) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// ---- host side -----------------------------------------------------------------------------
// A 2-D bf16 row-major matrix (rows x columns) read in boxes of box_rows x 64, swizzled.
bool make_map(CUtensorMap* map, const void* data, int64_t rows, int64_t columns, int box_rows) {
  return mla::make_swizzled_map(map, data, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, columns, box_rows);
}

// How many clusters of `blocks` blocks the GPU holds at once (0 if none), asked once per device.
int clusters_that_fit(int blocks, cudaLaunchConfig_t config) {
  static int known[64][kMaxCluster + 1] = {};  // 0: not asked yet; -1: none fit
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= 64) return 0;
  int& fit = known[device][blocks];
  if (fit == 0) {
    cudaLaunchAttribute cluster = *config.attrs;
    cluster.val.clusterDim.x = unsigned(blocks);
    config.attrs = &cluster;
    config.gridDim = dim3(unsigned(blocks));
    if (cudaOccupancyMaxActiveClusters(&fit, hopper_kernel, &config) != cudaSuccess || fit < 1) {
      cudaGetLastError();  // a refused cluster size is an answer, not an error to report later
      fit = -1;
    }
  }
  return fit > 0 ? fit : 0;
}

size_t shared_bytes() { return 1024 + kStages * kStageBytes + kLatentBytes + kBarriers * 8; }

bool takes_fast_path(const MlaProblem* p) {
  const bool aligned = (reinterpret_cast<uintptr_t>(p->hidden) | reinterpret_cast<uintptr_t>(p->w_down) |
                        reinterpret_cast<uintptr_t>(p->w_up_k) | reinterpret_cast<uintptr_t>(p->w_up_v) |
                        reinterpret_cast<uintptr_t>(p->out)) % 16 == 0;
  return mla::on_hopper() && p->dtype == MLA_BFLOAT16 && p->d_model % 8 == 0 && p->rank % 8 == 0 && p->rank <= kMaxRank &&
         p->heads * p->head_dim % 64 == 0 && aligned && mla::encode_function() != nullptr;
}

cudaLaunchConfig_t launch_config(cudaLaunchAttribute* cluster, cudaStream_t stream) {
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = 1;
  cluster->val.clusterDim.y = 1;
  cluster->val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared_bytes();
  config.stream = stream;
  config.attrs = cluster;
  config.numAttrs = 1;
  return config;
}

struct Plan {
  int blocks = 0;  // cluster size: blocks splitting GEMM 1's latent tiles through DSMEM
  int64_t groups = 1;
  int passes = 0;
  bool exchange = false;
  int splits = 1, split_chunks = 0;
  int64_t token_tiles = 0, latent_tiles = 0;
  // The workspace: the counters (`ready` per token tile, then `arrivals` per latent tile), the
  // fp32 sums when split along d_model (both zeroed before each launch), then the bf16 scratch.
  size_t counter_bytes() const { return size_t(mla::round_up(token_tiles * (1 + latent_tiles) * 4, 256)); }
  size_t sums_bytes() const { return splits > 1 ? size_t(token_tiles * kTokens * latent_tiles * kColumns * 4) : 0; }
  size_t workspace_bytes() const {
    return exchange ? counter_bytes() + sums_bytes() + size_t(token_tiles * kTokens * latent_tiles * kColumns * 2) : 0;
  }
};

// What splitting GEMM 1 along d_model adds to a block's work, in ring slots: the fp32 adds, the
// last part rounding its tile, the workspace's memset, before the latent tiles load. Read off an
// H100 A/B (kernels/06_hopper.md): at V2-Lite 1,000 tokens the split was faster (26.7 against
// 28.7 µs), at 2,048 slower (39.3 against 35.8). Split, those plans cost 20 and 36 slots plus
// this, against 40 and 48 without: any value from 12 to 20 keeps the faster plan at both.
constexpr double kSplitSlots = 16.0;

// Cluster size and groups (clusters splitting a token tile's output tiles), the cheapest by waves
// x one block's work, where a wave is as many clusters as the GPU holds at once (a cluster's
// blocks share a GPC, so fewer clusters of 4 than SMs / 4 may fit) and work counts ring slots:
// both GEMMs stream 32 KB per slot (GEMM 1 is bound by that stream, measured: kernels/06_hopper.md).
// Groups split GEMM 1 too, exchanging slices through global memory, when the whole grid is
// resident at once (a block waits for the others' slices) and that saves GEMM 1 passes;
// otherwise each group recomputes the latent. No block makes more than kHeldPasses passes (so at
// rank 512 clusters have at least 2 blocks). With more such groups (of one block) than latent
// tiles, GEMM 1 may be split along d_model as well, so that a few tokens' latent is not one
// block's stream of every d_model chunk.
Plan plan_launch(const MlaProblem* p, cudaLaunchConfig_t config, bool exchange_allowed) {
  const int64_t output_tiles = 2 * p->heads * p->head_dim / kColumns;
  const double down_slots = double(mla::ceil_div(p->d_model, kChunk));
  const double up_slots = double(mla::ceil_div(p->rank, kUpDepth));
  Plan best;
  best.token_tiles = mla::ceil_div(p->tokens, kTokens);
  best.latent_tiles = mla::ceil_div(p->rank, kColumns);
  double best_cost = 0.0;
  int64_t best_waves = 0;
  for (int blocks = kMaxCluster; blocks >= 1; blocks /= 2) {
    if (blocks > best.latent_tiles) continue;
    const int fit = clusters_that_fit(blocks, config);
    if (fit == 0) continue;
    for (int64_t groups = 1; groups == 1 || blocks * groups <= output_tiles; groups *= 2) {
      const int64_t waves = mla::ceil_div(best.token_tiles * groups, fit);
      const int64_t alone = mla::ceil_div(best.latent_tiles, blocks);
      const int64_t shared = mla::ceil_div(best.latent_tiles, blocks * groups);
      const bool exchange = exchange_allowed && waves == 1 && shared < alone;
      const int64_t passes = exchange ? shared : alone;
      if (passes > kHeldPasses) continue;
      const double cost = double(waves) * (double(passes) * down_slots +
                                            double(mla::ceil_div(output_tiles, blocks * groups)) * up_slots);
      auto consider = [&](double cost, int splits, int split_chunks) {
        if (best_cost == 0.0 || cost < 0.999 * best_cost || (cost < 1.001 * best_cost && waves < best_waves)) {
          best_cost = cost, best_waves = waves;
          best.blocks = blocks, best.groups = groups, best.exchange = exchange || splits > 1;
          best.passes = splits > 1 ? 1 : int(passes), best.splits = splits, best.split_chunks = split_chunks;
        }
      };
      consider(cost, 1, 0);
      if (blocks == 1 && exchange_allowed && waves == 1 && groups > best.latent_tiles) {
        const int64_t split_chunks = mla::ceil_div(int64_t(down_slots), groups / best.latent_tiles);
        const int64_t splits = mla::ceil_div(int64_t(down_slots), split_chunks);
        if (splits > 1) {
          consider(double(split_chunks) + double(mla::ceil_div(output_tiles, groups)) * up_slots +
                       double(best.latent_tiles) + kSplitSlots, int(splits), int(split_chunks));
        }
      }
    }
  }
  return best;
}

}  // namespace

extern "C" size_t mla_workspace_bytes(const MlaProblem* p) {
  if (!takes_fast_path(p) || mla::allow_shared_memory(hopper_kernel, shared_bytes()) != cudaSuccess) return 0;
  cudaLaunchAttribute cluster;
  return plan_launch(p, launch_config(&cluster, nullptr), true).workspace_bytes();
}

extern "C" int mla_takes(const MlaProblem* p) { return takes_fast_path(p); }

extern "C" cudaError_t mla_launch(const MlaProblem* p, cudaStream_t stream) {
  if (!takes_fast_path(p)) return cudaErrorNotSupported;  // the binding runs step 5 for these
  cudaError_t err = mla::allow_shared_memory(hopper_kernel, shared_bytes());
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute cluster;
  cudaLaunchConfig_t config = launch_config(&cluster, stream);
  const Plan plan = plan_launch(p, config, p->workspace != nullptr);
  if (plan.blocks == 0) return cudaErrorInvalidConfiguration;  // not even one block fits

  const int64_t width = p->heads * p->head_dim;
  auto* workspace = static_cast<uint8_t*>(p->workspace);
  auto* ready = reinterpret_cast<unsigned*>(workspace);
  auto* sums = reinterpret_cast<float*>(workspace + plan.counter_bytes());
  auto* scratch = reinterpret_cast<__nv_bfloat16*>(workspace + plan.counter_bytes() + plan.sums_bytes());
  CUtensorMap hidden_map, down_map, up_k_map, up_v_map, scratch_map = {};
  if (!make_map(&hidden_map, p->hidden, p->tokens, p->d_model, kTokens) ||
      !make_map(&down_map, p->w_down, p->d_model, p->rank, kChunk) ||
      !make_map(&up_k_map, p->w_up_k, p->rank, width, kUpDepth) ||
      !make_map(&up_v_map, p->w_up_v, p->rank, width, kUpDepth) ||
      (plan.exchange && !make_map(&scratch_map, scratch, plan.token_tiles * kTokens,
                                  plan.latent_tiles * kColumns, kTokens))) {
    return cudaErrorInvalidValue;
  }
  if (plan.exchange &&
      (err = cudaMemsetAsync(ready, 0, plan.counter_bytes() + plan.sums_bytes(), stream)) != cudaSuccess) {
    return err;
  }

  const Shapes shapes{p->tokens, p->d_model, p->rank, width, plan.passes, int(plan.groups), int(plan.exchange),
                      int(plan.latent_tiles), plan.splits, plan.split_chunks, scratch, ready,
                      ready + plan.token_tiles, sums};
  cluster.val.clusterDim.x = unsigned(plan.blocks);
  config.gridDim = dim3(unsigned(plan.token_tiles * plan.groups * plan.blocks));
  err = cudaLaunchKernelEx(&config, hopper_kernel, hidden_map, down_map, up_k_map, up_v_map, scratch_map,
                           static_cast<__nv_bfloat16*>(p->out), shapes);
  return err != cudaSuccess ? err : cudaGetLastError();
}
