#pragma once
// The SwiGLU formulas the CPU and CUDA kernels share, in the accumulation type Acc: float for
// 16-bit and float32 data, double for float64, or (CPU) a vector of them, at::vec::Vectorized.
// a = gate + its bias, b = up + its bias.
#include <c10/macros/Macros.h>

#include <cmath>

namespace apex::fused_swiglu {

C10_HOST_DEVICE inline float exp_of(float x) { return ::expf(x); }
C10_HOST_DEVICE inline double exp_of(double x) { return ::exp(x); }
template <class Vector>
inline Vector exp_of(const Vector& x) {  // at::vec::Vectorized: Sleef's exp
  return x.exp();
}

// 1 / (1 + e^-a), with the accurate exp and an IEEE division (as torch computes it). The CUDA
// kernels of 16-bit data pass a faster one (apex/fast_exp2.cuh's fast_sigmoid) in its place.
struct Sigmoid {
  template <class Acc>
  C10_HOST_DEVICE Acc operator()(Acc a) const {
    return Acc(1) / (Acc(1) + exp_of(Acc(0) - a));
  }
};

// y = silu(a) * b = a * sigmoid(a) * b.
template <class Acc, class SigmoidOf = Sigmoid>
C10_HOST_DEVICE inline Acc swiglu(Acc a, Acc b, SigmoidOf sigmoid = {}) {
  return a * sigmoid(a) * b;
}

// dy/da and dy/db times the incoming gradient g: silu'(a) = s * (1 + a * (1 - s)), s = sigmoid(a).
template <class Acc>
struct SwigluGrad {
  Acc gate;
  Acc up;
};

template <class Acc, class SigmoidOf = Sigmoid>
C10_HOST_DEVICE inline SwigluGrad<Acc> swiglu_grad(Acc g, Acc a, Acc b, SigmoidOf sigmoid = {}) {
  const Acc s = sigmoid(a);
  const Acc silu = a * s;
  return {g * b * (s + silu * (Acc(1) - s)), g * silu};
}

}  // namespace apex::fused_swiglu
