// A second kernel zeroes hidden's first element after the projection is done.
// EXPECT: modified its inputs
#define MLA_WRONG_INPUTS_MODIFIED
#include "wrong_kernel.cuh"
