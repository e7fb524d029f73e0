#pragma once
// Shared by the CPU and CUDA implementations of apex's fused LayerNorm / RMSNorm:
// the argument bundles every kernel receives, host-side validation, and one
// template that registers a device's two kernels under all four dispatcher ops.

#include "apex/check.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace apex::layer_norm {

// One forward launch over a [rows, cols] view of the input (cols = prod(normalized_shape)).
struct ForwardArgs {
  at::Tensor input;         // [rows, cols] contiguous, float / double / half / bfloat16
  at::Tensor weight, bias;  // [cols] contiguous or undefined; dtype = output dtype
  at::Tensor output;        // shape of input; dtype of weight when given, else of input
  at::Tensor mean;          // [rows] statistics dtype; undefined for RMSNorm
  at::Tensor invvar;        // [rows] 1 / sqrt(var + eps)  (RMSNorm: 1 / sqrt(mean(x^2) + eps))
  int64_t rows = 0, cols = 0;
  double eps = 0;
  bool rms = false;
};

// One backward launch. `input_or_output` holds the forward input, or its output
// when memory_efficient (then the normalized input is recomputed from it).
struct BackwardArgs {
  at::Tensor grad_output;               // output dtype
  at::Tensor mean, invvar;              // [rows]; mean undefined for RMSNorm
  at::Tensor input_or_output;           // [rows, cols] contiguous
  at::Tensor weight, bias;              // [cols] or undefined
  at::Tensor grad_input;                // dtype of input_or_output (as NVIDIA apex)
  at::Tensor grad_weight, grad_bias;    // [cols] or undefined when weight/bias is undefined
  int64_t rows = 0, cols = 0;
  double eps = 0;
  bool rms = false, memory_efficient = false;
};

using ForwardKernel = void (*)(const ForwardArgs&);
using BackwardKernel = void (*)(const BackwardArgs&);

// fp32 statistics for fp32/fp16/bf16 inputs, fp64 for fp64 inputs.
at::ScalarType statistics_dtype(at::ScalarType input_dtype);

// Validate and allocate (layer_norm_ops.cpp); raise c10::Error with a message naming the problem.
ForwardArgs prepare_forward(const at::Tensor& input, at::IntArrayRef normalized_shape,
                            const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                            double eps, bool rms);
BackwardArgs prepare_backward(const at::Tensor& grad_output, const std::optional<at::Tensor>& mean,
                              const at::Tensor& invvar, const at::Tensor& input_or_output,
                              at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                              const std::optional<at::Tensor>& bias, double eps, bool rms, bool memory_efficient);

// Grads of absent parameters travel through the dispatcher as empty tensors (schemas return Tensor, not Tensor?).
inline at::Tensor or_empty(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t : at::empty({0}, like.options());
}

// Registers `forward` / `backward` (one device's kernels) under the four ops declared in layer_norm_ops.cpp.
template <ForwardKernel forward, BackwardKernel backward>
void register_kernels(torch::Library& m) {
  using OptTensor = std::optional<at::Tensor>;
  m.impl("layer_norm_fwd", [](const at::Tensor& input, at::IntArrayRef normalized_shape, const OptTensor& weight,
                              const OptTensor& bias, double eps, bool /*memory_efficient: read by autograd*/) {
    ForwardArgs args = prepare_forward(input, normalized_shape, weight, bias, eps, /*rms=*/false);
    forward(args);
    return std::make_tuple(args.output, args.mean, args.invvar);
  });
  m.impl("rms_norm_fwd", [](const at::Tensor& input, at::IntArrayRef normalized_shape, const OptTensor& weight,
                            double eps, bool /*memory_efficient: read by autograd*/) {
    ForwardArgs args = prepare_forward(input, normalized_shape, weight, std::nullopt, eps, /*rms=*/true);
    forward(args);
    return std::make_tuple(args.output, args.invvar);
  });
  m.impl("layer_norm_bwd", [](const at::Tensor& grad_output, const at::Tensor& mean, const at::Tensor& invvar,
                              const at::Tensor& input_or_output, at::IntArrayRef normalized_shape,
                              const OptTensor& weight, const OptTensor& bias, double eps, bool memory_efficient) {
    BackwardArgs args = prepare_backward(grad_output, mean, invvar, input_or_output, normalized_shape, weight, bias,
                                         eps, /*rms=*/false, memory_efficient);
    backward(args);
    return std::make_tuple(args.grad_input, or_empty(args.grad_weight, grad_output),
                           or_empty(args.grad_bias, grad_output));
  });
  m.impl("rms_norm_bwd", [](const at::Tensor& grad_output, const at::Tensor& invvar, const at::Tensor& input_or_output,
                            at::IntArrayRef normalized_shape, const OptTensor& weight, double eps,
                            bool memory_efficient) {
    BackwardArgs args = prepare_backward(grad_output, std::nullopt, invvar, input_or_output, normalized_shape, weight,
                                         std::nullopt, eps, /*rms=*/true, memory_efficient);
    backward(args);
    return std::make_tuple(args.grad_input, or_empty(args.grad_weight, grad_output));
  });
}

// Calls f(T{}, W{}) for the supported (input, weight/output) dtype pairs: W == T, or W == float
// for half/bfloat16 input (NVIDIA apex's "mixed dtypes"). prepare_forward/backward already
// rejected every other pair.
template <typename F>
void dispatch_dtypes(at::ScalarType input, at::ScalarType weight, const char* name, F&& f) {
  const bool mixed = input != weight;
  switch (input) {
    case at::kFloat: return f(float{}, float{});
    case at::kDouble: return f(double{}, double{});
    case at::kHalf: return mixed ? f(at::Half{}, float{}) : f(at::Half{}, at::Half{});
    case at::kBFloat16: return mixed ? f(at::BFloat16{}, float{}) : f(at::BFloat16{}, at::BFloat16{});
    default: APEX_CHECK(false, name, ": unsupported dtype ", input);
  }
}

}  // namespace apex::layer_norm
