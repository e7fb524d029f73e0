#pragma once
// Lattice indexing and the loss's per-row terms, shared by the CPU and CUDA kernels.
#include <c10/macros/Macros.h>

#include <cmath>
#include <limits>

#include "transducer.h"

namespace apex::transducer {

struct Cell {
  int64_t b, t, u;
  bool valid;  // inside the lengths (always, for packed rows)
};

// First packed row of batch b.
C10_HOST_DEVICE inline int64_t batch_start(const Lattice& l, int64_t b) { return b == 0 ? 0 : l.batch_offset[b - 1]; }

C10_HOST_DEVICE inline Cell cell_of(const Lattice& l, int64_t row) {
  if (l.batch_offset == nullptr) {
    const int64_t u = row % l.max_u, bt = row / l.max_u, t = bt % l.max_t, b = bt / l.max_t;
    return {b, t, u, t < l.t_len[b] && u < l.u_len[b]};
  }
  int64_t lo = 0, hi = l.batch - 1;  // the first batch whose offset passes row
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (l.batch_offset[mid] > row) hi = mid; else lo = mid + 1;
  }
  const int64_t within = row - batch_start(l, lo), width = l.u_len[lo];
  const bool valid = width > 0 && row < l.batch_offset[l.batch - 1];
  return {lo, valid ? within / width : 0, valid ? within % width : 0, valid};
}

C10_HOST_DEVICE inline int64_t row_of(const Lattice& l, int64_t b, int64_t t, int64_t u) {
  return l.batch_offset == nullptr ? (b * l.max_t + t) * l.max_u + u : batch_start(l, b) + t * l.u_len[b] + u;
}

C10_HOST_DEVICE inline float log_add_exp(float a, float b) {
  const float hi = a > b ? a : b, lo = a > b ? b : a;
  if (hi == -std::numeric_limits<float>::infinity()) return hi;
  return hi + log1pf(expf(lo - hi));
}

// The gradient of -log P in the logits of cell (b, t, u) is
//   grad_loss[b] * (occupancy * softmax - through_blank * [v == blank] - through_label * [v == label])
// with occupancy = through_blank + through_label (the probability of passing through the cell).
struct CellGrad {
  float occupancy, through_blank, through_label;
};

// alpha, beta: [B, T, U]; t_len, u_len: this batch's lengths.
C10_HOST_DEVICE inline CellGrad cell_grad(const LossArgs& a, int64_t b, int64_t t, int64_t u) {
  const Lattice& l = a.lattice;
  const int64_t base = b * l.max_t * l.max_u, t_len = l.t_len[b], u_len = l.u_len[b];
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float start = a.alpha[base + t * l.max_u + u] - a.beta[base];  // alpha - log P
  const int64_t row = row_of(l, b, t, u);
  // Blank moves to (t + 1, u); from the last frame it ends the path (only at u = u_len - 1).
  const float after_blank = t + 1 < t_len ? a.beta[base + (t + 1) * l.max_u + u] : (u == u_len - 1 ? 0.0f : neg_inf);
  const float after_label = u + 1 < u_len ? a.beta[base + t * l.max_u + u + 1] : neg_inf;
  const float blank = expf(start + a.blank_logp[row] + after_blank);
  const float label = u + 1 < u_len ? expf(start + a.label_logp[row] + after_label) : 0.0f;
  return {blank + label, blank, label};
}

}  // namespace apex::transducer

namespace apex::transducer {

// Forward variable alpha(t, u) of batch b from its neighbours (alpha(0, 0) = 0).
C10_HOST_DEVICE inline float alpha_at(const LossArgs& a, int64_t b, int64_t t, int64_t u) {
  if (t == 0 && u == 0) return 0.0f;
  const Lattice& l = a.lattice;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float* alpha = a.alpha + b * l.max_t * l.max_u;
  const float from_blank = t > 0 ? alpha[(t - 1) * l.max_u + u] + a.blank_logp[row_of(l, b, t - 1, u)] : neg_inf;
  const float from_label = u > 0 ? alpha[t * l.max_u + u - 1] + a.label_logp[row_of(l, b, t, u - 1)] : neg_inf;
  return log_add_exp(from_blank, from_label);
}

// Backward variable beta(t, u): log-probability of finishing from (t, u), the last step being a
// blank from (t_len - 1, u_len - 1).
C10_HOST_DEVICE inline float beta_at(const LossArgs& a, int64_t b, int64_t t, int64_t u) {
  const Lattice& l = a.lattice;
  const int64_t t_len = l.t_len[b], u_len = l.u_len[b];
  const int64_t row = row_of(l, b, t, u);
  if (t == t_len - 1 && u == u_len - 1) return a.blank_logp[row];
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float* beta = a.beta + b * l.max_t * l.max_u;
  const float via_blank = t + 1 < t_len ? beta[(t + 1) * l.max_u + u] + a.blank_logp[row] : neg_inf;
  const float via_label = u + 1 < u_len ? beta[t * l.max_u + u + 1] + a.label_logp[row] : neg_inf;
  return log_add_exp(via_blank, via_label);
}

}  // namespace apex::transducer
