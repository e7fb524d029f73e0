#pragma once
// Formulas the CPU and CUDA kernels share (host and device).
#include <c10/macros/Macros.h>

#include <cmath>

namespace apex::group_norm {

// On the GPU, float takes the hardware approximations (ex2.approx, rcp.approx: a few ulp): the
// accurate expf and IEEE division cost ~20 instructions an element, which bound the SiLU passes.
C10_HOST_DEVICE inline float exp_of(float v) {
#if defined(__CUDA_ARCH__)
  return __expf(v);
#else
  return expf(v);
#endif
}
C10_HOST_DEVICE inline double exp_of(double v) { return exp(v); }

C10_HOST_DEVICE inline float reciprocal(float v) {
#if defined(__CUDA_ARCH__)
  return __fdividef(1.0f, v);  // 0 past 2^126, where the sigmoid is 0 anyway
#else
  return 1.0f / v;
#endif
}
C10_HOST_DEVICE inline double reciprocal(double v) { return 1.0 / v; }

template <class Acc>
C10_HOST_DEVICE inline Acc sigmoid(Acc z) {
  return reciprocal(Acc(1) + exp_of(-z));
}

// y of the pre-activation z.
template <class Acc>
C10_HOST_DEVICE inline Acc activate(Acc z, bool silu) {
  return silu ? z * sigmoid(z) : z;
}

// dy/dz: silu'(z) = s + z s (1 - s), s = sigmoid(z).
template <class Acc>
C10_HOST_DEVICE inline Acc activation_slope(Acc z, bool silu) {
  if (!silu) return Acc(1);
  const Acc s = sigmoid(z);
  return s * (Acc(1) + z * (Acc(1) - s));
}

// Mean and 1/sqrt(var + eps) of `count` values from their sums taken relative to `shift` (a value
// of the group, so that the sum of squares never cancels catastrophically).
template <class Acc>
struct Moments {
  Acc mean;
  Acc rstd;
};

template <class Acc>
C10_HOST_DEVICE inline Moments<Acc> moments(Acc sum, Acc sum_squares, Acc shift, Acc count, double eps) {
  const Acc centered = sum / count;
  const Acc var = sum_squares / count - centered * centered;
  return {shift + centered, Acc(1) / std::sqrt((var > Acc(0) ? var : Acc(0)) + static_cast<Acc>(eps))};
}

}  // namespace apex::group_norm
