#pragma once
// fused_layer_norm_cuda: what the LayerNorm / RMSNorm kernels take, and the kernels (one overload
// per device). Kernel sources include this header and apex's light ones only, never torch's.
//
// Every kernel sees a [rows, cols] view: cols = prod(normalized_shape), rows = the leading dims.
// Statistics (mean, invvar) are float32, float64 for float64 data (apex::statistics_dtype).
#include <cstdint>

#include "apex/device.h"
#include "apex/dtype.h"
#include "apex/scratch.h"

namespace apex::layer_norm {

// One forward call: y = (x - mean) * invvar * weight + bias (RMSNorm: mean = 0, no bias).
struct ForwardArgs {
  const void* input;    // [rows, cols] contiguous, of input_dtype
  const void* weight;   // [cols] of output_dtype, or null (1)
  const void* bias;     // [cols] of output_dtype, or null (0)
  void* output;         // [rows, cols] of output_dtype
  void* mean;           // [rows] statistics, or null for RMSNorm
  void* invvar;         // [rows] 1 / sqrt(var + eps)   (RMSNorm: 1 / sqrt(mean(x^2) + eps))
  int64_t rows, cols;   // rows >= 1, cols >= 1: the op function handles empty inputs
  Dtype input_dtype;    // float32, float16, bfloat16 or float64
  Dtype output_dtype;   // input_dtype, or float32 for a 16-bit input ("mixed dtypes")
  double eps;
  bool rms;
};

// One backward call. `input_or_output` holds the forward input, or its output when
// memory_efficient (the normalized input is then recovered as (y - bias) / weight).
struct BackwardArgs {
  const void* grad_output;      // [rows, cols] of output_dtype
  const void* input_or_output;  // [rows, cols] of input_dtype
  const void* mean;             // [rows] statistics; read only by LayerNorm without memory_efficient
  const void* invvar;           // [rows] statistics
  const void* weight;           // [cols] of output_dtype, or null
  const void* bias;             // [cols] of output_dtype, or null; read only when memory_efficient
  void* grad_input;             // [rows, cols] of input_dtype
  void* grad_weight;            // [cols] of output_dtype, or null when not wanted
  void* grad_bias;              // [cols] of output_dtype, or null when not wanted
  int64_t rows, cols;           // rows >= 1, cols >= 1
  Dtype input_dtype, output_dtype;
  double eps;
  bool rms, memory_efficient;
};

void forward(const Cpu&, const ForwardArgs&);    // layer_norm_cpu.cpp
void backward(const Cpu&, const BackwardArgs&);  // layer_norm_cpu.cpp
#ifdef APEX_WITH_CUDA
void forward(const Cuda&, const ForwardArgs&);                           // layer_norm_forward.cu
// The CUDA backward sizes its partial sums from the grid it picks, so it asks for them (apex/scratch.h).
void backward(const Cuda&, const BackwardArgs&, const Scratch& scratch);  // layer_norm_backward.cu
// Whether `device`'s current stream is capturing a CUDA graph (nothing may be read back then).
bool stream_is_capturing(const Cuda& device);                            // layer_norm_forward.cu
#endif

// Calls f(Type<T>{}, Type<W>{}) for the data type T and parameter/output type W of a call: W == T,
// or W == float for a 16-bit T (NVIDIA apex's "mixed dtypes"). The op functions refuse every other
// pair before launching, so no other pair is instantiated.
template <class F>
void dispatch_input_and_output(Dtype input, Dtype output, F&& f) {
  dispatch_floating(input, [&](auto t) {
    using T = typename decltype(t)::type;
    if constexpr (sizeof(T) == 2) {
      if (output == Dtype::kFloat32) return f(t, Type<float>{});
    }
    return f(t, t);
  });
}

}  // namespace apex::layer_norm
