// Launched on a stream of its own and waited for on the host: correct, but out of the caller's order.
// EXPECT: stream the binding passes
#define MLA_WRONG_SIDE_STREAM
#include "wrong_kernel.cuh"
