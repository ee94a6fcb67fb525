// Launched on the legacy default stream instead of the stream the binding passes.
// EXPECT: stream the binding passes
#define MLA_WRONG_LEGACY_STREAM
#include "wrong_kernel.cuh"
