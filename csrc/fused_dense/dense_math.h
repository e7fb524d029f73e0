#pragma once
// The activations and their derivatives, shared by the CPU and CUDA kernels (one formula each).
// Computed in float (double for double data), as torch computes them.
#include <c10/macros/Macros.h>

#include <cmath>
#include <type_traits>

#include "dense.h"

namespace apex::fused_dense {

// float for 16-bit and float data, double for double.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

C10_HOST_DEVICE inline float erf_of(float x) { return ::erff(x); }
C10_HOST_DEVICE inline double erf_of(double x) { return ::erf(x); }
C10_HOST_DEVICE inline float exp_of(float x) { return ::expf(x); }
C10_HOST_DEVICE inline double exp_of(double x) { return ::exp(x); }
C10_HOST_DEVICE inline float tanh_of(float x) { return ::tanhf(x); }
C10_HOST_DEVICE inline double tanh_of(double x) { return ::tanh(x); }

// GELU's constants: 1/sqrt(2), 1/sqrt(2*pi), and the tanh approximation's sqrt(2/pi) and cubic term.
constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluTanhCubic = 0.044715;

// activation(x).
template <class A>
C10_HOST_DEVICE inline A activate(A x, Activation activation) {
  switch (activation) {
    case Activation::kRelu:
      return x < A(0) ? A(0) : x;  // NaN stays NaN, as torch.relu
    case Activation::kSigmoid:
      return A(1) / (A(1) + exp_of(-x));
    case Activation::kGelu:
      return A(0.5) * x * (A(1) + erf_of(x * A(kSqrtHalf)));
    case Activation::kGeluTanh: {
      const A inner = A(kSqrt2OverPi) * (x + A(kGeluTanhCubic) * x * x * x);
      return A(0.5) * x * (A(1) + tanh_of(inner));
    }
    case Activation::kNone:
      break;
  }
  return x;
}

// activation'(x), from x for GELU and from y = activation(x) for ReLU and sigmoid.
template <class A>
C10_HOST_DEVICE inline A activation_derivative(A saved, Activation activation) {
  switch (activation) {
    case Activation::kRelu:
      return saved > A(0) ? A(1) : A(0);
    case Activation::kSigmoid:
      return saved * (A(1) - saved);
    case Activation::kGelu: {
      const A cdf = A(0.5) * (A(1) + erf_of(saved * A(kSqrtHalf)));
      const A pdf = A(kInvSqrt2Pi) * exp_of(A(-0.5) * saved * saved);
      return cdf + saved * pdf;
    }
    case Activation::kGeluTanh: {
      const A x2 = saved * saved;
      const A t = tanh_of(A(kSqrt2OverPi) * saved * (A(1) + A(kGeluTanhCubic) * x2));
      const A inner_derivative = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluTanhCubic) * x2);
      return A(0.5) * (A(1) + t) + A(0.5) * saved * (A(1) - t * t) * inner_derivative;
    }
    case Activation::kNone:
      break;
  }
  return A(1);
}

}  // namespace apex::fused_dense
