// fp32 operands rounded to TF32 before each product, in a step held to fp32's accuracy.
// EXPECT: what TF32 gives
#define MLA_WRONG_TF32
#include "wrong_kernel.cuh"
