// A call with the inputs and output of the call before is skipped: the output left from then is returned.
// EXPECT: second call | never written
#define MLA_WRONG_CACHED_OUTPUT
#include "wrong_kernel.cuh"
