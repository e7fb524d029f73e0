#pragma once
// The per-element formulas of the focal loss, shared by the CPU and CUDA kernels (host and device).
#include <c10/macros/Macros.h>

#include <cmath>

namespace apex::focal_loss {

constexpr int64_t kBackground = -1;
constexpr int64_t kIgnored = -2;

// log(1 + e^-a) for a >= 0. log1p is a polynomial (no special-function unit), which keeps the
// SFU, busy with the exps, from limiting 16-bit inputs.
C10_HOST_DEVICE inline float log1p_exp_neg(float a) { return log1pf(expf(-a)); }
C10_HOST_DEVICE inline double log1p_exp_neg(double a) { return log1p(exp(-a)); }
C10_HOST_DEVICE inline float exp_of(float v) { return expf(v); }
C10_HOST_DEVICE inline double exp_of(double v) { return exp(v); }

template <class Acc>
struct Element {
  Acc loss;  // a * m * BCE, unnormalized
  Acc grad;  // its derivative in x
};

// kWithGrad: the forward needs only the loss (no sigmoid, one exp fewer per element).
template <bool kWithGrad, class Acc>
C10_HOST_DEVICE inline Element<Acc> focal_element(Acc x, bool positive, Acc alpha, Acc gamma, Acc smoothing) {
  // softplus(-x) = -log sigmoid(x), softplus(x) = -log(1 - sigmoid(x)), both overflow-free.
  const Acc tail = log1p_exp_neg(x >= Acc(0) ? x : -x);
  const Acc softplus_neg = (x >= Acc(0) ? Acc(0) : -x) + tail;
  const Acc target = positive ? Acc(1) - smoothing / Acc(2) : smoothing / Acc(2);
  const Acc bce = softplus_neg + (Acc(1) - target) * x;
  // m = exp(-gamma * softplus(+-x)); gamma == 0 gives exactly 1 even where softplus is infinite.
  const Acc log_base = positive ? softplus_neg + x : softplus_neg;
  const Acc factor = (positive ? alpha : Acc(1) - alpha) * (gamma == Acc(0) ? Acc(1) : exp_of(-gamma * log_base));
  Element<Acc> out{factor * bce, Acc(0)};
  if constexpr (kWithGrad) {
    const Acc sigma = exp_of(-softplus_neg);
    // d(m)/dx / m = gamma * (1 - sigma) for negatives, -gamma * sigma for the positive class.
    const Acc dlog_m = positive ? -gamma * sigma : gamma * (Acc(1) - sigma);
    out.grad = factor * (dlog_m * bce + sigma - target);
  }
  return out;
}

}  // namespace apex::focal_loss
