// Math the multi-tensor functors share between CPU and CUDA: a functor is a template over
// its value type V, which is float/double in CUDA kernels and at::vec::Vectorized<float|double>
// on CPU (multi_tensor_apply_cpu.h specialises VecMath for those), so one formula serves both.
// No torch headers: CUDA kernel sources include this.
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "apex/dtype.h"

namespace apex::multi_tensor {

template <class V>
struct VecMath;

template <class F>
struct ScalarMath {
  static C10_HOST_DEVICE F sqrt(F x) { return std::sqrt(x); }
  static C10_HOST_DEVICE F abs(F x) { return std::fabs(x); }
  // NaN-propagating max (fmax would drop a NaN, hiding it from the overflow check).
  static C10_HOST_DEVICE F max(F a, F b) { return (a != a || a > b) ? a : b; }
  static C10_HOST_DEVICE F min(F a, F b) { return (a != a || a < b) ? a : b; }
  static C10_HOST_DEVICE bool isfinite(F x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return ::isfinite(x);
#else
    return std::isfinite(x);
#endif
  }
  // a * b + c rounded once, as torch's `x.add_(y, alpha=a)` computes it (fused multiply-add).
  static C10_HOST_DEVICE F fma(F a, F b, F c) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    if constexpr (std::is_same_v<F, float>) return fmaf(a, b, c);
    return ::fma(a, b, c);
#else
    return std::fma(a, b, c);
#endif
  }
  // x as a tensor of `dtype` would store it: torch's optimizers round every intermediate they
  // keep in a tensor, and matching them in fp16 means rounding where they do.
  static C10_HOST_DEVICE F round_to(F x, Dtype dtype) {
    switch (dtype) {
      case Dtype::kFloat16: return static_cast<F>(static_cast<float>(c10::Half(static_cast<float>(x))));
      case Dtype::kBFloat16: return static_cast<F>(static_cast<float>(c10::BFloat16(static_cast<float>(x))));
      case Dtype::kFloat32: return static_cast<F>(static_cast<float>(x));
      case Dtype::kFloat64: return x;
    }
    return x;
  }
};

template <>
struct VecMath<float> : ScalarMath<float> {};
template <>
struct VecMath<double> : ScalarMath<double> {};

// Host- and device-side power of a float (bias corrections computed from a device-side step).
C10_HOST_DEVICE inline float pow_scalar(float base, float exponent) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return ::powf(base, exponent);
#else
  return std::pow(base, exponent);
#endif
}

C10_HOST_DEVICE inline float cos_scalar(float x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return ::cosf(x);
#else
  return std::cos(x);
#endif
}

// A float argument of a kernel: either a value known when the op is called, or read by the
// kernel from memory its device can reach (a one-element tensor, or one value per tensor of the
// call), so that a CUDA graph replays a tensor's current value (capturable optimizers keep lr,
// step counts and the loss scale on the GPU).
struct ScalarArg {
  float value = 0.f;
  const float* ptr = nullptr;
  bool per_tensor = false;  // ptr[tensor] rather than ptr[0]
  C10_HOST_DEVICE float get(int64_t tensor = 0) const { return ptr ? ptr[per_tensor ? tensor : 0] : value; }
};

}  // namespace apex::multi_tensor
