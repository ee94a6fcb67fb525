// The grid covers whole groups of 4 tokens only: the last tokens' outputs are never written.
// EXPECT: never written
#define MLA_WRONG_NO_TAIL_GUARD
#include "wrong_kernel.cuh"
