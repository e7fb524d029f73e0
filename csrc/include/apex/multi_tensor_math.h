// Math the multi-tensor functors share between CPU and CUDA: a functor is a template over
// its value type V, which is float/double in CUDA kernels and at::vec::Vectorized<float|double>
// on CPU (multi_tensor_apply_cpu.h specialises VecMath for those), so one formula serves both.
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>

namespace apex::multi_tensor {

template <class V>
struct VecMath;

template <class F>
struct ScalarMath {
  static C10_HOST_DEVICE F sqrt(F x) { return std::sqrt(x); }
  static C10_HOST_DEVICE F abs(F x) { return std::fabs(x); }
  // NaN-propagating max (fmax would drop a NaN, hiding it from the overflow check).
  static C10_HOST_DEVICE F max(F a, F b) { return (a != a || a > b) ? a : b; }
  static C10_HOST_DEVICE bool isfinite(F x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return ::isfinite(x);
#else
    return std::isfinite(x);
#endif
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

// A float argument that is either a plain value or read from a one-element float32 tensor
// on the kernels' device (capturable optimizers keep lr/step/inv_scale on the GPU so a CUDA
// graph replays them with their current values).
struct ScalarArg {
  float value = 0.f;
  const float* ptr = nullptr;
  C10_HOST_DEVICE float get() const { return ptr ? *ptr : value; }
};

}  // namespace apex::multi_tensor
