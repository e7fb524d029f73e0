#pragma once
// 2^x on the special-function unit (MUFU.EX2, ex2.approx.ftz: ~2 ulp), subnormal results flushed
// to zero: one instruction where exp2f() adds a range check and a rescale around it. exp2(-inf) = 0;
// results below 2^-126 (1e-38) become 0, which no softmax or log-sum-exp here can tell from 0 (each
// sum holds its max's 1). double and ROCm: exp2.
//
// fast_sigmoid builds 1 / (1 + e^-x) on it and the unit's reciprocal (rcp.approx.ftz: ~1 ulp): two
// MUFU instructions and two FMA-pipe ones, where expf and an IEEE division take ~25 with a slow-path
// branch. Within a few ulp of float, so for kernels whose data is 16-bit (2^13 times coarser).
#include <c10/macros/Macros.h>

#include <cmath>

namespace apex {

C10_DEVICE C10_ALWAYS_INLINE float fast_exp2(float x) {
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

C10_DEVICE C10_ALWAYS_INLINE double fast_exp2(double x) { return exp2(x); }

C10_DEVICE C10_ALWAYS_INLINE float fast_sigmoid(float x) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float denominator = 1.0f + fast_exp2(-kLog2e * x);  // inf for x < ~-88: the sigmoid is 0 there
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(denominator));
  return y;
#else
  return 1.0f / denominator;
#endif
}

}  // namespace apex
