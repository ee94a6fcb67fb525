// The one contract between a kernel step and the rest of the course.
//
// Every step file implements `mla_launch` with exactly this signature. The torch binding
// (mla_lab/csrc/binding.cpp) checks the tensors, allocates the output and passes raw pointers
// here, so a step file needs no torch headers: it compiles in about a second, and a broken
// exercise breaks only itself.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

typedef enum { MLA_FLOAT32 = 0, MLA_BFLOAT16 = 1 } MlaDtype;

// All tensors are dense and row-major; `out` holds (tokens, 2, heads, head_dim), which is the
// contiguous (B, S, 2, H, hd) result with B and S folded into tokens. Index 0 of the "2" axis is k.
typedef struct {
  const void* hidden;  // (tokens, d_model)
  const void* w_down;  // (d_model, rank)
  const void* w_up_k;  // (rank, heads * head_dim)
  const void* w_up_v;  // (rank, heads * head_dim)
  void* out;           // (tokens, 2, heads * head_dim)
  int64_t tokens;
  int64_t d_model;
  int64_t rank;
  int64_t heads;
  int64_t head_dim;
  MlaDtype dtype;
  void* workspace;     // mla_workspace_bytes(problem) bytes of GPU scratch, or NULL when it says 0
  const void* prepared;  // what mla_prepare wrote for these very weights, or NULL: then a step that
                         // reads the weights in a layout of its own makes it again on every call
} MlaProblem;

#ifdef __cplusplus
extern "C" {
#endif
// Enqueues the projection on `stream` and returns the launch's error code (cudaSuccess if none).
// Called only with tokens >= 1 and every size >= 1.
cudaError_t mla_launch(const MlaProblem* problem, cudaStream_t stream);
// Optional: a step that needs scratch memory on the GPU also exports this. The binding asks it
// (with workspace NULL) before each launch and passes that many bytes, uninitialized, allocated
// on the launch's stream like the output; a step without it always gets NULL.
size_t mla_workspace_bytes(const MlaProblem* problem);
// Optional, for a step that reads the weights in a layout of its own (transposed, split into
// parts): the bytes of that layout (0 where the step's own kernel does not take these weights),
// and the launch that writes it into `prepared`. Both read only the weights and the sizes. The
// caller keeps the result while the weights stay unchanged and passes it as problem->prepared,
// as an inference engine prepares its weights once, not on every call.
size_t mla_prepared_bytes(const MlaProblem* problem);
cudaError_t mla_prepare(const MlaProblem* problem, void* prepared, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
