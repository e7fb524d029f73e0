#pragma once
// xentropy: softmax cross entropy with label smoothing over the last dimension of [rows, classes]
// logits. What its kernels take (plain structs) and the kernels, one overload per device. Kernel
// sources include this and apex's light headers only.
//
// Per row r with label y = labels[r], V = classes, s = smoothing:
//   lse      = log(sum_j exp(x_j))                                  (max_log_sum_exp, saved for backward)
//   loss     = lse - (1 - s) * x_y - s * mean_j(x_j)                 (= -(1-s) log p_y - s mean_j log p_j)
//   dloss/dx = g * (softmax(x) - (1 - s) * onehot(y) - s / V)
// Rows whose label is ignore_index have loss 0, lse 0 and gradient 0 (their logits are never read).
// A label outside [0, V) that is not ignore_index gives a NaN loss and NaN gradient row (checking it
// on the host would need a device sync).
#include "apex/device.h"
#include "apex/dtype.h"

namespace apex::xentropy {

// Row-major logits: element (r, j) at logits[r * row_stride + j], j < classes.
struct LogitsView {
  const void* data;
  int64_t rows;
  int64_t classes;
  int64_t row_stride;
  Dtype dtype;
};

struct ForwardArgs {
  LogitsView logits;
  const int64_t* labels;    // [rows]
  int64_t ignore_index;
  double smoothing;
  void* losses;             // [rows], float32 (float64 for float64 logits)
  void* max_log_sum_exp;    // [rows], same dtype as losses
};

struct BackwardArgs {
  LogitsView logits;
  const int64_t* labels;          // [rows]
  int64_t ignore_index;
  double smoothing;
  const void* grad_loss;          // element r at grad_loss[r * grad_stride]; dtype of losses
  int64_t grad_stride;            // 0 for the expanded gradient of a sum or mean
  const void* max_log_sum_exp;    // [rows], dtype of losses
  void* grad_logits;              // [rows, classes] contiguous, dtype of logits
};

void forward(const Cpu&, const ForwardArgs&);    // xentropy_cpu.cpp
void backward(const Cpu&, const BackwardArgs&);
void forward(const Cuda&, const ForwardArgs&);   // xentropy_cuda.cu
void backward(const Cuda&, const BackwardArgs&);

}  // namespace apex::xentropy
