#pragma once
// Per-element formulas shared by the CPU and CUDA kernels (host and device).

#if defined(__CUDACC__) || defined(__HIPCC__)
#define APEX_LN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define APEX_LN_HOST_DEVICE inline
#endif

namespace apex::layer_norm {

// Keeps |gamma| >= eps so that recovering the normalized input from the output
// (y - beta) / gamma cannot divide by ~0 (NVIDIA apex's memory-efficient backward).
template <typename A>
APEX_LN_HOST_DEVICE A clamp_by_magnitude(A gamma, A eps) {
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

  APEX_LN_HOST_DEVICE A operator()(A x_or_y, A gamma, A beta) const {
    if (!from_output) return (x_or_y - mean) * invvar;
    const A shifted = has_beta ? x_or_y - beta : x_or_y;
    return has_gamma ? shifted / clamp_by_magnitude(gamma, eps) : shifted;
  }
};

}  // namespace apex::layer_norm
