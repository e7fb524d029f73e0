#pragma once
// syncbn: what the SyncBatchNorm kernels take, and the kernels (one overload per device). Kernel
// sources include this header and apex's light ones only, never torch's.
//
// NCHW and channels-last inputs share the kernels through `Layout`: element (o, c, i) of an
// (outer, channels, inner) view lives at (o * channels + c) * inner + i. NCHW is (N, C, H*W...);
// channels-last is (N*H*W..., C, 1). Per-channel vectors (statistics, affine parameters, gradient
// sums) are contiguous [C] of the statistics type: float, double for double data (apex::
// statistics_dtype). Kernels only ever see non-empty inputs: the op functions handle empty ones.
#include <c10/macros/Macros.h>

#include <cstdint>

#include "apex/device.h"
#include "apex/dtype.h"
#include "apex/scratch.h"

namespace apex::syncbn {

struct Layout {
  int64_t outer;
  int64_t channels;
  int64_t inner;
  // Also true for NCHW input with one element per plane, which is the same memory.
  C10_HOST_DEVICE bool channels_last() const { return inner == 1; }
};

// welford_mean_var: per-channel mean and biased variance of `input`.
struct StatisticsArgs {
  const void* input;
  void* mean;
  void* var_biased;
  Layout layout;
  Dtype dtype;  // of input
};

// reduce_bn: per-channel sum(dy) and sum(dy * (x - mean)); with grad_weight, also the weight's
// gradient sum(dy * (x - mean)) * inv_std, written where the sums are (no separate multiply op).
struct GradSumsArgs {
  const void* grad_output;
  const void* input;
  const void* mean;
  const void* inv_std;  // read only with grad_weight
  void* sum_dy;
  void* sum_dy_xmu;
  void* grad_weight;  // [C] of the statistics type, or null (not computed)
  Layout layout;
  Dtype dtype;
};

// welford_parallel: merges [world, C] means and biased variances with [world] counts into the
// global mean, unbiased variance and 1 / sqrt(biased variance + eps); then, when given, moves the
// running statistics toward them: running += momentum * (statistic - running).
struct MergeArgs {
  const void* mean;
  const void* var_biased;
  const int64_t* count;  // [world] elements per channel of each rank, on the device; or null: one
  int64_t elements;      // rank of `elements` (a host value: one process's step fills no count tensor)
  void* out_mean;
  void* out_var;
  void* inv_std;
  void* running_mean;  // [C] of the statistics type, or null (not updated)
  void* running_var;   // [C] of the statistics type, or null
  int64_t world, channels;
  Dtype dtype;  // of the statistics: float32 or float64
  double eps;
  double momentum;
};

// inverse_std: inv_std = 1 / sqrt(var + eps) per channel (eval: the running variance), as
// welford_parallel computes it from the batch's.
struct InverseStdArgs {
  const void* var;
  void* inv_std;
  int64_t channels;
  Dtype dtype;  // of the statistics: float32 or float64
  double eps;
};

// batchnorm_forward: out = (x - mean) * inv_std * weight + shift [+ z] [relu].
// relu_backward: out = grad_output where that (pre-relu) value is positive, else 0.
struct NormalizeArgs {
  const void* input;
  const void* z;            // like input, or null (0)
  const void* grad_output;  // like input: relu_backward only
  const void* mean;
  const void* inv_std;
  const void* weight;  // or null (1)
  const void* shift;   // or null (0)
  void* out;
  Layout layout;
  Dtype dtype;
  bool fuse_relu;
};

// batchnorm_backward: dx = (dy - sum_dy / n - (x - mean) * inv_std^2 * sum_dy_xmu / n) * inv_std * weight,
// n = the sum of the [world] counts (the global number of elements per channel).
struct InputGradArgs {
  const void* grad_output;
  const void* input;
  const void* mean;
  const void* inv_std;
  const void* weight;  // or null (1)
  const void* sum_dy;      // or null, with sum_dy_xmu: 0 (statistics that are constants, as in eval)
  const void* sum_dy_xmu;
  const int64_t* count;  // [world] on the device, or null: `elements` (see MergeArgs)
  int64_t elements;
  int64_t world;
  void* grad_input;
  Layout layout;
  Dtype dtype;
};

void welford_mean_var(const Cpu&, const StatisticsArgs&);  // syncbn_cpu.cpp
void reduce_bn(const Cpu&, const GradSumsArgs&);
void welford_parallel(const Cpu&, const MergeArgs&);
void inverse_std(const Cpu&, const InverseStdArgs&);
void batchnorm_forward(const Cpu&, const NormalizeArgs&);
void relu_backward(const Cpu&, const NormalizeArgs&);
void batchnorm_backward(const Cpu&, const InputGradArgs&);
#ifdef APEX_WITH_CUDA
// The reductions size their per-slice partial states from the grid they pick (apex/scratch.h).
void welford_mean_var(const Cuda&, const StatisticsArgs&, const Scratch&);  // reductions.cu
void reduce_bn(const Cuda&, const GradSumsArgs&, const Scratch&);
void welford_parallel(const Cuda&, const MergeArgs&);
void inverse_std(const Cuda&, const InverseStdArgs&);
void batchnorm_forward(const Cuda&, const NormalizeArgs&);  // elementwise.cu
void relu_backward(const Cuda&, const NormalizeArgs&);
void batchnorm_backward(const Cuda&, const InputGradArgs&);
#endif

}  // namespace apex::syncbn
