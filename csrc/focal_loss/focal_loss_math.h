#pragma once
// The per-element formulas of the focal loss, shared by the CPU and CUDA kernels (host and device).
//
// Every class is written in terms of y, "the logit of the wrong answer": y = x for a negative class,
// y = -x for the positive one (sigmoid(-x) = 1 - sigmoid(x), and BCE(x, t) = BCE(-x, 1 - t)). Then,
// with u = smoothing / 2 (the smoothed target of the wrong answer, for either kind of class):
//   loss     = a * m * BCE,            BCE = softplus(y) - u * y,   m = sigmoid(y)^gamma
//   dloss/dy = a * m * (gamma * sigmoid(-y) * BCE + sigmoid(y) - u),   dloss/dx = +-dloss/dy
// with a = 1 - alpha for a negative class, alpha for the positive one. One exponential serves all
// of it: with e = exp(-|y|) (the same for x and -x) and r = 1 / (1 + e),
//   softplus(y) = max(y, 0) + log(1 + e),   sigmoid(y) = r (y >= 0) or e * r (y < 0),
//   sigmoid(-y) = the other one of the two (so 1 - sigmoid is never a cancelling subtraction).
//
// Precision: the host (CPU kernels) and double use the accurate library functions. Float on a
// CUDA device uses the special-function unit's approximations directly (ex2/lg2/rcp.approx.ftz:
// about 2 ulp relative for exp and 1/x, 2^-22 absolute for log2 near 1; results below 2^-126 flush
// to 0, where every term they feed is negligible). The full-precision expf/log1pf are long FMA
// sequences that made the kernels instruction-bound at a quarter of memory bandwidth. The error is
// relative ~1e-6 on a loss or gradient term that matters, absolute ~1e-7 on log(1 + e) where e is
// small (and m ~ e^2 multiplies it): float32 keeps this path too. Emulated with these bounds at
// their worst on the tests' cases, the loss stays within 2% of its 2e-5 tolerance and float32
// gradients within 6% of theirs (16-bit gradients: their own rounding, ~25%, dominates).
#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

#include "focal_loss.h"  // kGammaTwo, kAnyGamma

namespace apex::focal_loss {

constexpr int64_t kBackground = -1;
constexpr int64_t kIgnored = -2;

#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
#define APEX_FOCAL_LOSS_APPROX_PTX 1
#endif

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// exp(-|v|).
C10_HOST_DEVICE inline float exp_neg_abs(float v) {
#if defined(APEX_FOCAL_LOSS_APPROX_PTX)
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(fabsf(v) * -kLog2e));
  return out;
#elif defined(__HIP_DEVICE_COMPILE__)
  return __expf(-fabsf(v));
#else
  return std::exp(-std::fabs(v));
#endif
}
C10_HOST_DEVICE inline double exp_neg_abs(double v) { return ::exp(-::fabs(v)); }

// The unit of the logarithms the formulas below carry (log1p_of, BCE, the loss): ln 2 on the
// device's float path, which keeps log2 (what lg2 gives) and scales a sum once instead of every
// element; 1 (natural logarithms) everywhere else.
template <class Acc>
C10_HOST_DEVICE constexpr Acc log_unit() {
#if defined(APEX_FOCAL_LOSS_APPROX_PTX)
  if constexpr (sizeof(Acc) == sizeof(float)) return kLn2;
#endif
  return Acc(1);
}

// log(1 + e) / log_unit() for e in [0, 1], given one_plus_e = 1 + e (the device takes its log;
// the host keeps log1p's accuracy for small e).
C10_HOST_DEVICE inline float log1p_of(float e, float one_plus_e) {
#if defined(APEX_FOCAL_LOSS_APPROX_PTX)
  float out;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(one_plus_e));
  return out;
#elif defined(__HIP_DEVICE_COMPILE__)
  return __logf(one_plus_e);
#else
  (void)one_plus_e;
  return std::log1p(e);
#endif
}
C10_HOST_DEVICE inline double log1p_of(double e, double /*one_plus_e*/) { return ::log1p(e); }

// 1 / d for d in [1, 2].
C10_HOST_DEVICE inline float reciprocal(float d) {
#if defined(APEX_FOCAL_LOSS_APPROX_PTX)
  float out;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(d));
  return out;
#elif defined(__HIP_DEVICE_COMPILE__)
  return __fdividef(1.0f, d);
#else
  return 1.0f / d;
#endif
}
C10_HOST_DEVICE inline double reciprocal(double d) { return 1.0 / d; }

// 1 / (1 + e) from l = log1p_of(e, 1 + e): exp(-l * log_unit()), one ex2 on the device float path.
C10_HOST_DEVICE inline float reciprocal_from_log1p(float l) {
#if defined(APEX_FOCAL_LOSS_APPROX_PTX)
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(-l));
  return out;
#elif defined(__HIP_DEVICE_COMPILE__)
  return __expf(-l);
#else
  return std::exp(-l);
#endif
}

// exp(v) (the modulating factor of a gamma other than 2).
C10_HOST_DEVICE inline float exp_of(float v) {
#if defined(APEX_FOCAL_LOSS_APPROX_PTX)
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(v * kLog2e));
  return out;
#elif defined(__HIP_DEVICE_COMPILE__)
  return __expf(v);
#else
  return std::exp(v);
#endif
}
C10_HOST_DEVICE inline double exp_of(double v) { return ::exp(v); }

// What follows from e = exp(-|y|), the same for y and -y (so for either kind of class).
template <class Acc>
struct Softplus {
  Acc e;        // exp(-|y|)
  Acc log1p_e;  // log(1 + e) / log_unit(): (softplus(y) - max(y, 0)) / log_unit()
  Acc r;        // 1 / (1 + e) = sigmoid(|y|)
};

// One element's Softplus terms (the CUDA kernels batch the reciprocals of a pack instead).
template <class Acc>
C10_HOST_DEVICE inline Softplus<Acc> softplus_of(Acc x) {
  const Acc e = exp_neg_abs(x);
  const Acc d = Acc(1) + e;
  return {e, log1p_of(e, d), reciprocal(d)};
}

template <class Acc>
struct Element {
  Acc loss;  // m * BCE / log_unit(): the loss without its weight a, in log units
  Acc grad;  // m * (gamma * sigmoid(-y) * BCE + sigmoid(y) - u): dloss/dy without a
};

// The loss (and, kWithGrad, its derivative in y) of one class with wrong-answer logit y, from its
// Softplus terms; u = smoothing / 2. kGamma: kGammaTwo (gamma is 2: a square) or kAnyGamma (one
// more exponential).
template <int kGamma, bool kWithGrad, class Acc>
C10_HOST_DEVICE inline Element<Acc> focal_terms(Acc y, const Softplus<Acc>& s, Acc gamma, Acc u) {
  constexpr Acc unit = log_unit<Acc>();
  const bool above = y >= Acc(0);
  const Acc er = s.e * s.r;
  const Acc p = above ? s.r : er;  // sigmoid(y)
  // BCE = max(y, 0) + log(1 + e) - u * y, in log units: one select of a slope, one FMA.
  const Acc bce = s.log1p_e + y * (above ? (Acc(1) - u) / unit : -u / unit);
  Acc m;
  if constexpr (kGamma == kGammaTwo) {
    m = p * p;
  } else {
    // sigmoid(y)^gamma = exp(-gamma * softplus(-y)); gamma == 0 gives exactly 1 even for an
    // infinite softplus.
    m = gamma == Acc(0) ? Acc(1) : exp_of(-gamma * ((above ? Acc(0) : -y) + unit * s.log1p_e));
  }
  Element<Acc> out{m * bce, Acc(0)};
  if constexpr (kWithGrad) {
    const Acc q = above ? er : s.r;  // sigmoid(-y) = 1 - p
    const Acc g = (kGamma == kGammaTwo ? Acc(2) : gamma) * unit;
    out.grad = m * (g * q * bce + (p - u));
  }
  return out;
}

// The loss and the gradient in x of one class, weighted by a (the host's per-element path).
template <int kGamma, bool kWithGrad, class Acc>
C10_HOST_DEVICE inline Element<Acc> focal_element(Acc x, bool positive, Acc alpha, Acc gamma, Acc u) {
  const Element<Acc> t = focal_terms<kGamma, kWithGrad>(positive ? -x : x, softplus_of(x), gamma, u);
  const Acc a = positive ? alpha : Acc(1) - alpha;
  return {a * t.loss * log_unit<Acc>(), (positive ? -a : a) * t.grad};
}

}  // namespace apex::focal_loss
