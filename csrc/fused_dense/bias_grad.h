#pragma once
// fused_dense: the backward's one elementwise pass at a layer's pre-activation: the activation's
// derivative and the bias gradient together, reading grad and saved once and writing grad_input once
// (torch eager runs them as two passes, the second re-reading grad_input; apex did too).
//
//   grad_input[r, c] = grad[r, c] * activation'(saved[r, c])      (rounded to the data's dtype)
//   grad_bias[c]     = sum over r of grad_input[r, c]              (the rounded values, summed in acc_t)
//
// The sum is of the stored, rounded grad_input, as eager's grad_input.sum(0) is: grad_bias then
// matches the gradient the weight-gradient GEMM reads, and eager's result within float32
// accumulation error.
//
// Deterministic: rows are cut into tiles of a fixed number of rows (a constant of each kernel
// file), each tile's column sums are taken in one fixed order into a workspace [tiles, cols] of
// acc_t, and the tiles are then folded in order. No atomics: the same inputs give the same bits on
// every run, whatever the thread count (CPU) or grid (CUDA) and, on GPUs, whatever the GPU model.
#include <cstdint>

#include "apex/device.h"
#include "apex/dtype.h"
#include "apex/scratch.h"
#include "dense.h"

namespace apex::fused_dense {

// grad, saved (as ActivationGradArgs says: the activation's input for GELU, its output for ReLU and
// sigmoid; not read for kNone) and grad_input are contiguous [rows, cols]; grad_bias [cols].
// grad_input may alias grad (in place), or be null: then only grad_bias is computed (of the values
// grad_input would hold). rows == 0 gives grad_bias zeros. The workspace comes from `scratch`.
struct ActivationBiasGradArgs {
  const void* grad;
  const void* saved;
  void* grad_input;
  void* grad_bias;
  int64_t rows;
  int64_t cols;
  Dtype dtype;
  Activation activation;
};

void activation_bias_grad(const Cpu&, const ActivationBiasGradArgs&, const Scratch& scratch);   // bias_grad_cpu.cpp
void activation_bias_grad(const Cuda&, const ActivationBiasGradArgs&, const Scratch& scratch);  // bias_grad_cuda.cu

}  // namespace apex::fused_dense
