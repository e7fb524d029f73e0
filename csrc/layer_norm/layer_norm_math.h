#pragma once
// Per-element formulas shared by the CPU and CUDA kernels (host and device).
#include <c10/macros/Macros.h>

#include "apex/acc_type.h"

namespace apex::layer_norm {

// The type statistics and sums are computed in: float, double for double data.
template <class T>
using Acc = acc_type<T>;

// Keeps |gamma| >= eps so that recovering the normalized input from the output, (y - beta) / gamma,
// never divides by ~0 (NVIDIA apex's memory-efficient backward). A gamma of exactly 0 never gets
// here: the op keeps the input instead of the output then (layer_norm.cpp).
template <typename A>
C10_HOST_DEVICE C10_ALWAYS_INLINE A clamp_by_magnitude(A gamma, A eps) {
  if (gamma >= A(0)) return gamma < eps ? eps : gamma;
  return gamma > -eps ? -eps : gamma;
}

// The normalized input xhat (what multiplies gamma), from either the forward input x
// (xhat = (x - mean) * invvar, mean = 0 for RMSNorm) or, when memory efficient, the
// forward output y = xhat * gamma + beta.
template <typename A>
struct NormalizedInput {
  A mean, invvar, eps;
  bool from_output, has_gamma, has_beta;

  C10_HOST_DEVICE C10_ALWAYS_INLINE A operator()(A x_or_y, A gamma, A beta) const {
    if (!from_output) return (x_or_y - mean) * invvar;
    const A shifted = has_beta ? x_or_y - beta : x_or_y;
    return has_gamma ? shifted / clamp_by_magnitude(gamma, eps) : shifted;
  }
};

// dx of one element from the row's two means (of g*dy and of g*dy*xhat).
template <bool RMS, typename A>
C10_HOST_DEVICE C10_ALWAYS_INLINE A grad_input(A invvar, A gdy, A xhat, A mean_gdy, A mean_gdy_xhat) {
  return invvar * (RMS ? gdy - xhat * mean_gdy_xhat : gdy - mean_gdy - xhat * mean_gdy_xhat);
}

}  // namespace apex::layer_norm
