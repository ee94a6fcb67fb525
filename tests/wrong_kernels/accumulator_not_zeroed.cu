// Each latent sum starts from what shared memory held, not from zero.
// EXPECT: wrong on
#define MLA_WRONG_ACCUMULATOR_NOT_ZEROED
#include "wrong_kernel.cuh"
