#pragma once
// transducer: the RNN-T joint network's sum and the RNN-T loss (NVIDIA apex's transducer_joint_cuda
// and transducer_loss_cuda). What the kernels take and the kernels, one overload per device.
//
// Both work on a lattice of rows (b, t, u), t < t_len[b], u < u_len[b], each a vector of `width`
// values. Unpacked, row (b, t, u) is (b * T + t) * U + u of a [B, T, U, width] tensor, and rows past
// the lengths are "don't care"; packed, the rows of batch b are consecutive from
// batch_offset[b - 1] (0 for b = 0), t-major: row = start + t * u_len[b] + u.
//
// Joint:  h[row(b,t,u)] = f[b, t] + g[b, u] (then ReLU, dropout); don't-care rows get -1 (finite, so
//         that nothing downstream turns them into NaN). Backward: f_grad[b, t] = sum over u of
//         h_grad * mask, g_grad[b, u] = sum over t; a ReLU mask that was not stored is recomputed
//         from f and g (the forward's float test on the same sum, so the same mask bit for bit).
// Loss:   x are logits [rows, V]; with p = softmax(x) (log-probabilities rounded to x's dtype, as
//         NVIDIA apex's log_softmax in that dtype gives them), alpha/beta are the forward/backward
//         log-probabilities of the lattice (u_len = label length + 1) and loss[b] = -beta(b, 0, 0).
#include "apex/device.h"
#include "apex/dtype.h"

namespace apex::transducer {

struct Lattice {
  int64_t batch;            // B
  int64_t max_t, max_u;     // T and U of the unpacked layout (and of alpha / beta)
  const int64_t* t_len;     // [B]
  const int64_t* u_len;     // [B]
  const int64_t* batch_offset;  // [B] cumulative packed rows, or null: unpacked
  int64_t rows;             // rows of the data tensor
};

// ---- joint ----

struct JointArgs {
  Lattice lattice;
  int64_t width;            // H
  Dtype dtype;
  const void* f;            // [B, T, H]
  const void* g;            // [B, U, H]
  bool relu;
  const bool* keep;         // [rows, H] dropout keep-mask, or null (no dropout)
  float scale;              // dropout's 1 / (1 - p)
  void* h;                  // [rows, H]
  uint8_t* mask;            // [rows, H]: 1 where h passed ReLU and dropout; null when not wanted
};

struct JointBackwardArgs {
  Lattice lattice;
  int64_t width;
  Dtype dtype;
  const void* h_grad;       // [rows, H]
  const uint8_t* mask;      // [rows, H] or null
  float scale;
  void* f_grad;             // [B, T, H]
  void* g_grad;             // [B, U, H]
  float* workspace;         // joint_backward_workspace(...) floats, or null when that is 0
  // ReLU without a stored mask: h_grad passes where !(f[b, t] + g[b, u] <= 0), the forward's test on
  // the same float sum. Both null otherwise; unused when mask is given.
  const void* f = nullptr;  // [B, T, H]
  const void* g = nullptr;  // [B, U, H]
};

void joint_forward(const Cpu&, const JointArgs&);             // transducer_cpu.cpp
void joint_backward(const Cpu&, const JointBackwardArgs&);
void joint_forward(const Cuda&, const JointArgs&);            // transducer_joint_cuda.cu
void joint_backward(const Cuda&, const JointBackwardArgs&);
// Floats of scratch joint_backward needs (the CUDA kernel's partial g_grad sums over blocks of
// frames, when one pass splits the frames; 0: none). `workspace` is not read.
int64_t joint_backward_workspace(const Cpu&, const JointBackwardArgs&);
int64_t joint_backward_workspace(const Cuda&, const JointBackwardArgs&);

// ---- loss ----

struct LossArgs {
  Lattice lattice;
  int64_t classes;          // V
  Dtype dtype;
  const void* x;            // [rows, V] logits
  const int64_t* labels;    // [B, max_u - 1]
  int64_t label_stride;     // labels' row stride
  int64_t blank;
  float* lse;               // [rows]: log-sum-exp of each row
  float* blank_logp;        // [rows]: log p(blank)
  float* label_logp;        // [rows]: log p(label(b, u)) for u < u_len - 1
  float* alpha;             // [B, T, U]
  float* beta;              // [B, T, U]
  void* loss;               // [B], x's dtype
};

struct LossBackwardArgs {
  LossArgs forward;         // its inputs and saved statistics (outputs unused)
  const float* grad_loss;   // [B]
  bool fused_softmax;       // the gradient in the logits (else in the log-probabilities)
  void* grad;               // [rows, V], x's dtype; don't-care rows 0
};

void loss_forward(const Cpu&, const LossArgs&);
void loss_backward(const Cpu&, const LossBackwardArgs&);
void loss_forward(const Cuda&, const LossArgs&);                 // transducer_loss_cuda.cu
void loss_backward(const Cuda&, const LossBackwardArgs&);

}  // namespace apex::transducer
