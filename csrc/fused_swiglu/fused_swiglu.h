#pragma once
// fused_bias_swiglu: y = silu(x1 + b1) * (x2 + b2), where x1, x2 (and b1, b2) are the two halves of
// the last dimension of x [rows, 2H] (gate first, then up: Megatron's layout of a fused gate/up
// projection). What its kernels take (plain structs) and the kernels, one overload per device.
#include "apex/device.h"
#include "apex/dtype.h"

namespace apex::fused_swiglu {

// x [rows, 2 * half] and y [rows, half], both contiguous; bias [2 * half] or null. One dtype.
struct ForwardArgs {
  const void* x;
  const void* bias;
  void* y;
  int64_t rows;
  int64_t half;
  Dtype dtype;
};

// grad_x [rows, 2 * half] from grad_y [rows, half] (all contiguous, x's dtype). With grad_bias set
// (bias given), also grad_bias [2 * half] = the column sums of grad_x, folded from per-chunk
// partial sums in `workspace` (bias_grad_workspace_bytes(...) bytes, allocated by the caller).
struct BackwardArgs {
  const void* grad_y;
  const void* x;
  const void* bias;
  void* grad_x;
  void* grad_bias;
  void* workspace;
  int64_t rows;
  int64_t half;
  Dtype dtype;
};

void forward(const Cpu&, const ForwardArgs&);  // fused_swiglu_cpu.cpp
void backward(const Cpu&, const BackwardArgs&);
int64_t bias_grad_workspace_bytes(const Cpu&, int64_t rows, int64_t half, Dtype dtype);
void forward(const Cuda&, const ForwardArgs&);  // fused_swiglu_cuda.cu
void backward(const Cuda&, const BackwardArgs&);
int64_t bias_grad_workspace_bytes(const Cuda&, int64_t rows, int64_t half, Dtype dtype);

}  // namespace apex::fused_swiglu
