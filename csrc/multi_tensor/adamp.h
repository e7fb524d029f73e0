// multi_tensor_adamp: AdamP (Heo et al., "AdamP: Slowing Down the Slowdown for Momentum Optimizers
// on Scale-invariant Weights"), as its authors' code and Ascend's NpuFusedAdamP compute it.
//
// For a param of 2+ dims, rows ("channels", dim 0) and the whole tensor ("layer") are candidate
// scale-invariant views. Where the grad is nearly orthogonal to the param in every channel
// (max |cos(g_c, p_c)| < delta / sqrt(channel size)), or else in the layer, the Adam direction
// `perturb` loses its component along the param (per channel or layer) and weight decay is scaled
// by wd_ratio. Three passes over the lists:
//   1. rows pass (stats): the Adam moments, and per row piece the sums g.p, g.g, p.p, p.perturb;
//   2. finish: per row the projection coefficient k_r = (p_r . perturb_r) / (||p_r|| + eps)^2
//      (or the layer's for every row, or 0), per tensor the weight-decay factor;
//   3. rows pass (apply): p = p * decay - lr / bias_correction1 * (perturb - k_r * p).
// Rows are memory-contiguous runs (the op keeps dim 0 outermost), processed in pieces of at most
// kPieceElems elements so that every piece's partial sums are written in a fixed order.
#pragma once

#include "apex/multi_tensor_kernel.h"

namespace apex::multi_tensor {

// Sums pass 1 keeps per piece: g.p, g.g, p.p, p.perturb.
constexpr int kAdampSums = 4;

struct AdampArgs {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f, weight_decay = 0.f, delta = 0.1f,
        wd_ratio = 0.1f;
  bool nesterov = false;
  ScalarArg step;  // one count, or one per tensor
};

// Scratch of one step, float32 on the kernels' device: the pieces' sums [pieces][kAdampSums], each
// row's projection coefficient [rows], each tensor's weight-decay factor [count].
struct AdampBuffers {
  float* piece_sums;
  float* coefficients;
  float* decay;
};

// The Adam direction, from the updated moments: m / (sqrt(v) / sqrt(bc2) + eps), Nesterov's with
// (beta1 m + (1 - beta1) g) in place of m.
struct AdampDirection {
  AdampArgs a;
  float bias_correction2_sqrt = 1.f;
  APEX_HD void resolve(int64_t tensor) {
    bias_correction2_sqrt = ScalarMath<float>::sqrt(1.f - pow_scalar(a.beta2, a.step.get(tensor)));
  }
  template <class V>
  APEX_HD V perturb(V g, V m, V v) const {
    const V denom = VecMath<V>::sqrt(v) / V(bias_correction2_sqrt) + V(a.epsilon);
    return (a.nesterov ? V(a.beta1) * m + V(1.f - a.beta1) * g : m) / denom;
  }
};

// Pass 1 on [grads, params, exp_avgs, exp_avg_sqs]: the moments, and the sums of a row piece.
struct AdampStatsFunctor : FunctorBase<AdampStatsFunctor>, AdampDirection {
  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2, 3}); }
  APEX_HD ListMask writes() const { return lists_mask({2, 3}); }
  APEX_HD AdampStatsFunctor at_tensor(int64_t tensor) const {
    AdampStatsFunctor r = *this;
    r.resolve(tensor);
    return r;
  }
  template <class V>
  APEX_HD Sums<V, kAdampSums> operator()(V& g, V& p, V& m, V& v) const {
    m = V(a.beta1) * m + V(1.f - a.beta1) * g;
    v = V(a.beta2) * v + V(1.f - a.beta2) * g * g;
    const V direction = perturb(g, m, v);
    return {{g * p, g * g, p * p, p * direction}};
  }
};

// Pass 3 on the same lists: the projected step and the (scaled) weight decay.
struct AdampApplyFunctor : FunctorBase<AdampApplyFunctor>, AdampDirection {
  const float* coefficients = nullptr;  // per global row
  const float* decay = nullptr;         // per tensor
  // Resolved by at_tensor / at_row.
  float step_size = 0.f, decay_factor = 1.f, coefficient = 0.f;

  APEX_HD ListMask reads() const { return a.nesterov ? lists_mask({0, 1, 2, 3}) : lists_mask({1, 2, 3}); }
  APEX_HD ListMask writes() const { return lists_mask({1}); }
  APEX_HD AdampApplyFunctor at_tensor(int64_t tensor) const {
    AdampApplyFunctor r = *this;
    r.resolve(tensor);
    r.step_size = a.lr / (1.f - pow_scalar(a.beta1, a.step.get(tensor)));
    r.decay_factor = decay[tensor];
    return r;
  }
  APEX_HD AdampApplyFunctor at_row(int64_t row) const {
    AdampApplyFunctor r = *this;
    r.coefficient = coefficients[row];
    return r;
  }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m, V& v) const {
    const V projected = perturb(g, m, v) - V(coefficient) * p;
    p = p * V(decay_factor) - V(step_size) * projected;
  }
};

// Pass 2 for one tensor, from the sums of its rows (each [kAdampSums]) and their totals: the
// coefficient of every row, and the tensor's weight-decay factor.
struct AdampDecision {
  bool channel = false, layer = false;
  APEX_HD static float cosine(const float* sums, float eps) {
    return ScalarMath<float>::abs(sums[0]) / (ScalarMath<float>::sqrt(sums[1]) + eps) /
           (ScalarMath<float>::sqrt(sums[2]) + eps);
  }
  // p_n = p / (||p|| + eps); perturb -= p_n * sum(p_n * perturb) = p * k.
  APEX_HD static float coefficient(const float* sums, float eps) {
    const float norm = ScalarMath<float>::sqrt(sums[2]) + eps;
    return sums[3] / (norm * norm);
  }
  APEX_HD float decay(const AdampArgs& a) const {
    if (a.weight_decay <= 0.f) return 1.f;
    return 1.f - a.lr * a.weight_decay * (channel || layer ? a.wd_ratio : 1.f);
  }
};

// The whole step on [grads, params, exp_avgs, exp_avg_sqs] (lists.rows set).
void adamp(const Cpu&, const TensorLists& lists, int* flag, const AdampArgs& args, const AdampBuffers& buffers);
void adamp(const Cuda&, const TensorLists& lists, int* flag, const AdampArgs& args, const AdampBuffers& buffers);

}  // namespace apex::multi_tensor
