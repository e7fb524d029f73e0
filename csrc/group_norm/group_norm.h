#pragma once
// group_norm: GroupNorm over NHWC (channels_last) or NCHW data with an optional fused SiLU/Swish,
// any channel and group count (channels % groups == 0). What the kernels take and the kernels.
//
// For sample n, group g (channels [g*Cg, (g+1)*Cg), Cg = C / G) and channel c of the group:
//   mean, rstd = statistics of x[n, group g, all spatial positions];  xhat = (x - mean) * rstd
//   z = xhat * weight[c] + bias[c];  y = silu ? z * sigmoid(z) : z
// Backward, with dz = dy * (silu ? dsilu(z) : 1):
//   dx = rstd * (weight[c] * dz - mean_g(weight * dz) - xhat * mean_g(weight * dz * xhat))
//   grad_weight[c] = sum over n, positions of dz * xhat;  grad_bias[c] = sum of dz
#include "apex/device.h"
#include "apex/dtype.h"

namespace apex::group_norm {

enum class Layout : int8_t { kNhwc, kNchw };

struct Shape {
  int64_t samples;   // N
  int64_t channels;  // C
  int64_t groups;    // G
  int64_t spatial;   // S: product of the dimensions after the channel one (1 for [N, C])
  Layout layout;
};

// weight / bias are Acc-typed (float; double for float64 data), or null (weight 1, bias 0).
struct ForwardArgs {
  Shape shape;
  Dtype dtype;           // of x and y
  const void* x;
  const void* weight;
  const void* bias;
  double eps;
  bool silu;
  void* y;
  void* mean;            // [N, G], Acc
  void* rstd;            // [N, G], Acc
  void* workspace;       // workspace_bytes(...) of scratch (CUDA; every byte read is written first)
};

struct BackwardArgs {
  Shape shape;
  Dtype dtype;           // of x, dy and dx
  const void* x;
  const void* dy;
  const void* weight;
  const void* bias;      // read only when silu (to recompute z)
  const void* mean;
  const void* rstd;
  bool silu;
  void* dx;
  void* grad_weight;     // [C], Acc; written when not null
  void* grad_bias;       // [C], Acc; written when not null
  void* workspace;       // workspace_bytes(...) of scratch (CUDA; every byte read is written first)
};

void forward(const Cpu&, const ForwardArgs&);    // group_norm_cpu.cpp
void backward(const Cpu&, const BackwardArgs&);
void forward(const Cuda&, const ForwardArgs&);   // group_norm_cuda.cu
void backward(const Cuda&, const BackwardArgs&);
// Bytes of scratch the kernels need, either direction (the CPU ones need none).
int64_t workspace_bytes(const Cuda&, const Shape& shape, Dtype dtype);
inline int64_t workspace_bytes(const Cpu&, const Shape&, Dtype) { return 0; }

}  // namespace apex::group_norm
