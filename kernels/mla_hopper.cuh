// Helpers shared by the Hopper (sm_90) steps and experiments: mbarriers, programmatic dependent
// launch, TMA tensor copies and their tensor maps, wgmma's operand descriptors and fences. Only
// code built for sm_90 (and sm_90a, for wgmma) includes it; kernels/mla_common.cuh holds what
// every step shares.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

namespace mla {

// ---- mbarriers ---------------------------------------------------------------------------------
// A barrier completes its phase once `count` threads have arrived and the bytes it was told to
// expect have landed; waiters name the phase's parity.
__device__ __forceinline__ void barrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// A wait acquires at the scope of the arrivals it waits for: the block's own threads (and copies),
// or, where blocks of the cluster arrive on it remotely, the cluster.
enum class Scope { kBlock, kCluster };
template <Scope kScope = Scope::kBlock>
__device__ __forceinline__ void barrier_wait(uint32_t bar, uint32_t parity) {
#define MLA_TRY_WAIT(semantics)                                                                          \
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity" semantics ".shared::cta.b64 p, [%1], %2;\n"  \
               "selp.u32 %0, 1, 0, p;\n}\n"                                                              \
               : "=r"(done) : "r"(bar), "r"(parity) : "memory")
  uint32_t done = 0;
  while (!done) {
    if constexpr (kScope == Scope::kCluster) {
      MLA_TRY_WAIT(".acquire.cluster");
    } else {
      MLA_TRY_WAIT("");
    }
  }
#undef MLA_TRY_WAIT
}

// ---- programmatic dependent launch ------------------------------------------------------------
// A kernel launched as a programmatic dependent of the one before it in its stream (the launch
// attribute cudaLaunchAttributeProgrammaticStreamSerialization) may start while that one still
// runs. launch_dependents lets the next kernel start; wait_for_previous_kernel returns once the
// kernel before has finished and its writes are visible. In a kernel launched plainly both do
// nothing, so one kernel serves both launches.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

constexpr unsigned kNoClusters = 0;

// kernel<<<grid, block, shared_bytes, stream>>>(args...): with `after_kernel`, as a programmatic
// dependent of the kernel launched before it on `stream`; with cluster_y > 0, in clusters of that
// many blocks along y. The first kernel of a call is not a dependent: what ran before it (another
// library's kernel, a copy) need not let it start early.
template <class... Params, class... Args>
cudaError_t launch(bool after_kernel, unsigned cluster_y, void (*kernel)(Params...), dim3 grid, dim3 block,
                   size_t shared_bytes, cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (after_kernel) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_y != kNoClusters) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = 1;
    attributes[count].val.clusterDim.y = cluster_y;
    attributes[count++].val.clusterDim.z = 1;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, Params(args)...);
}

// ---- TMA ---------------------------------------------------------------------------------------
// One thread copies the box of `map` at (x, y) into shared memory at dst; it completes on the
// mbarrier at bar, counting the whole box's bytes (boxes past a tensor's edge land zeros).
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(&map)), "r"(x), "r"(y), "r"(bar) : "memory");
}

// cuTensorMapEncodeTiled through the runtime (no -lcuda), or nullptr where the driver lacks it.
inline PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      function = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// A 2-D row-major matrix (rows x columns) of `element_bytes`-byte elements read in boxes of
// box_rows x one 128-byte row, swizzled as wgmma reads them without bank conflicts.
inline bool make_swizzled_map(CUtensorMap* map, const void* data, CUtensorMapDataType type, int element_bytes,
                              int64_t rows, int64_t columns, int box_rows) {
  const cuuint64_t dims[2] = {cuuint64_t(columns), cuuint64_t(rows)};
  const cuuint64_t row_stride[1] = {cuuint64_t(columns) * cuuint64_t(element_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(128 / element_bytes), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode_function()(map, type, 2, const_cast<void*>(data), dims, row_stride, box, element_strides,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// ---- wgmma -------------------------------------------------------------------------------------
// A shared-memory operand: start address, leading and stride byte offsets, 128-byte swizzle.
// K-major (rows of one 128-byte run of K: 64 bf16 or 32 fp32): groups of 8 rows are `stride` =
// 1024 bytes apart; `leading` unused. MN-major (bf16 only: rows of 64 columns at one k): 64-column
// boxes are `leading` bytes apart, groups of 8 k-rows `stride` = 1024 bytes apart (PTX ISA,
// "Matrix Descriptor Format").
__device__ __forceinline__ uint64_t descriptor(uint32_t address, uint32_t leading, uint32_t stride) {
  return uint64_t((address & 0x3FFFF) >> 4) | uint64_t((leading & 0x3FFFF) >> 4) << 16 |
         uint64_t((stride & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}

// wgmma's accumulators in PTX: the register list {%0, ..., %(N-1)} for N = 32, 64 or 128 fp32
// registers a thread, and the operands that fill it, eight of array d's elements at a time
// ("+f": wgmma reads and writes them). The instruction's other operands follow from %N.
#define MLA_PTX_REGS_0_31 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                          "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MLA_PTX_REGS_32_63 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                           "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MLA_PTX_REGS_64_127 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                            "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
                            "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
                            "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MLA_WGMMA_D32 "{" MLA_PTX_REGS_0_31 "}"
#define MLA_WGMMA_D64 "{" MLA_PTX_REGS_0_31 ", " MLA_PTX_REGS_32_63 "}"
#define MLA_WGMMA_D128 "{" MLA_PTX_REGS_0_31 ", " MLA_PTX_REGS_32_63 ", " MLA_PTX_REGS_64_127 "}"
#define MLA_WGMMA_ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                       "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define MLA_WGMMA_ACC32(d, i) MLA_WGMMA_ACC8(d, i), MLA_WGMMA_ACC8(d, i + 8), MLA_WGMMA_ACC8(d, i + 16), MLA_WGMMA_ACC8(d, i + 24)
#define MLA_WGMMA_ACC64(d, i) MLA_WGMMA_ACC32(d, i), MLA_WGMMA_ACC32(d, i + 32)

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Keeps the compiler from touching the accumulators across asynchronous wgmma.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace mla
