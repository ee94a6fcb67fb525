// Step 10 — Hopper, fp32 inputs at fp32's accuracy: step 9 with every product in three TF32 passes.
//
// What changed from step 9, and why. One TF32 pass rounds each operand to 10 bits of mantissa
// (rel. error about 4e-4 at V2-Lite), and exact fp32 on the FFMA pipes (step 4, cuBLAS) runs at a
// seventh of the TF32 tensor cores' rate. Three passes keep fp32's accuracy at about twice FFMA's
// speed: each operand is split into TF32 parts, x = hi + lo, and a·b is taken as a_lo·b_hi +
// a_hi·b_lo + a_hi·b_hi, every product of two TF32 values exact in fp32. Two costs come with it:
// hidden gets a split kernel of its own, and the tensor cores' running sums, which round toward
// zero, must be handed to FADDs every 4 chunks, or their bias (about 2e-5 at d_model 2048) is what
// is left of the error (kernels/NOTES.md, "Three TF32 passes").
//
// The code is step 9's: this file only switches it to three passes.
#define MLA_THREE_PASSES 1
#include "09_tf32_wgmma.cu"
