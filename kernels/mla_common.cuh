// Device helpers shared by every step: element conversion and the dtype switch.
// Inputs may be float32 or bfloat16; every step accumulates in float32 and rounds once on store.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "mla_launch.h"

// An exercise stub: `python -m mla_lab exercises` puts this where a solution region was. It
// compiles to nothing, and the grader finds it in the source and reports "not implemented yet".
#define MLA_NOT_IMPLEMENTED() \
  do {                        \
  } while (0)

namespace mla {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

using TypedLauncher = cudaError_t (*)(const MlaProblem&, cudaStream_t);

// Picks the element type named by problem->dtype; `launch<T>` is the step's templated launcher.
inline cudaError_t dispatch(const MlaProblem* problem, cudaStream_t stream,
                            TypedLauncher launch_f32, TypedLauncher launch_bf16) {
  switch (problem->dtype) {
    case MLA_FLOAT32: return launch_f32(*problem, stream);
    case MLA_BFLOAT16: return launch_bf16(*problem, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace mla

// The exported entry point of a step whose templated launcher is `launch<T>`.
#define MLA_DEFINE_LAUNCHER(launch)                                                   \
  extern "C" cudaError_t mla_launch(const MlaProblem* problem, cudaStream_t stream) { \
    return mla::dispatch(problem, stream, launch<float>, launch<__nv_bfloat16>);      \
  }
