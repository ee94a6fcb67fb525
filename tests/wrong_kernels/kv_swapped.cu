// The k half of the output is computed from w_up_v and the v half from w_up_k.
// EXPECT: k and v are swapped
#define MLA_WRONG_KV_SWAPPED
#include "wrong_kernel.cuh"
