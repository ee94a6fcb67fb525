// The last latent value is read from shared memory that no thread wrote.
// EXPECT: wrong on
#define MLA_WRONG_UNINITIALISED_SHARED
#include "wrong_kernel.cuh"
