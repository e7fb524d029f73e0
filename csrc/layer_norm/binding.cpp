// NVIDIA apex's `fused_layer_norm_cuda` Python functions (names and argument order kept), as thin
// wrappers over the apex::layer_norm_* / apex::rms_norm_* dispatcher ops, so one function serves
// CPU and CUDA tensors.

#include "apex/check.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>

#include <optional>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using LayerNormFwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, at::IntArrayRef, const OptTensor&,
                                                        const OptTensor&, double, bool);
using RmsNormFwd = std::tuple<Tensor, Tensor>(const Tensor&, at::IntArrayRef, const OptTensor&, double, bool);
using LayerNormBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                        at::IntArrayRef, const OptTensor&, const OptTensor&, double,
                                                        bool);
using RmsNormBwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, at::IntArrayRef,
                                              const OptTensor&, double, bool);

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// apex's non-mixed entry points read gamma as the input's dtype; say so instead of reinterpreting.
void check_same_dtype(const Tensor& input, const Tensor& gamma, const char* fn) {
  APEX_CHECK(gamma.scalar_type() == input.scalar_type(), fn, ": gamma has dtype ", gamma.scalar_type(),
             " but input has dtype ", input.scalar_type(), "; use ", fn, "_mixed_dtypes for float32 parameters");
}

std::vector<Tensor> layer_norm(const Tensor& input, at::IntArrayRef normalized_shape, double epsilon) {
  auto [out, mean, invvar] = op<LayerNormFwd>("apex::layer_norm_fwd").call(input, normalized_shape, std::nullopt,
                                                                          std::nullopt, epsilon, false);
  return {out, mean, invvar};
}

std::vector<Tensor> layer_norm_affine_mixed_dtypes(const Tensor& input, at::IntArrayRef normalized_shape,
                                                   const Tensor& gamma, const Tensor& beta, double epsilon) {
  auto [out, mean, invvar] =
      op<LayerNormFwd>("apex::layer_norm_fwd").call(input, normalized_shape, gamma, beta, epsilon, false);
  return {out, mean, invvar};
}

std::vector<Tensor> layer_norm_affine(const Tensor& input, at::IntArrayRef normalized_shape, const Tensor& gamma,
                                      const Tensor& beta, double epsilon) {
  check_same_dtype(input, gamma, "forward_affine");
  return layer_norm_affine_mixed_dtypes(input, normalized_shape, gamma, beta, epsilon);
}

Tensor layer_norm_gradient(const Tensor& dout, const Tensor& mean, const Tensor& invvar,
                           const Tensor& input_or_output, at::IntArrayRef normalized_shape, double epsilon,
                           bool memory_efficient) {
  return std::get<0>(op<LayerNormBwd>("apex::layer_norm_bwd")
                         .call(dout, mean, invvar, input_or_output, normalized_shape, std::nullopt, std::nullopt,
                               epsilon, memory_efficient));
}

std::vector<Tensor> layer_norm_gradient_affine(const Tensor& dout, const Tensor& mean, const Tensor& invvar,
                                               const Tensor& input_or_output, at::IntArrayRef normalized_shape,
                                               const Tensor& gamma, const Tensor& beta, double epsilon,
                                               bool memory_efficient) {
  auto [grad_input, grad_gamma, grad_beta] =
      op<LayerNormBwd>("apex::layer_norm_bwd")
          .call(dout, mean, invvar, input_or_output, normalized_shape, gamma, beta, epsilon, memory_efficient);
  return {grad_input, grad_gamma, grad_beta};
}

std::vector<Tensor> rms_norm(const Tensor& input, at::IntArrayRef normalized_shape, double epsilon) {
  auto [out, invvar] =
      op<RmsNormFwd>("apex::rms_norm_fwd").call(input, normalized_shape, std::nullopt, epsilon, false);
  return {out, invvar};
}

std::vector<Tensor> rms_norm_affine_mixed_dtypes(const Tensor& input, at::IntArrayRef normalized_shape,
                                                 const Tensor& gamma, double epsilon) {
  auto [out, invvar] = op<RmsNormFwd>("apex::rms_norm_fwd").call(input, normalized_shape, gamma, epsilon, false);
  return {out, invvar};
}

std::vector<Tensor> rms_norm_affine(const Tensor& input, at::IntArrayRef normalized_shape, const Tensor& gamma,
                                    double epsilon) {
  check_same_dtype(input, gamma, "rms_forward_affine");
  return rms_norm_affine_mixed_dtypes(input, normalized_shape, gamma, epsilon);
}

Tensor rms_norm_gradient(const Tensor& dout, const Tensor& invvar, const Tensor& input_or_output,
                         at::IntArrayRef normalized_shape, double epsilon, bool memory_efficient) {
  return std::get<0>(op<RmsNormBwd>("apex::rms_norm_bwd")
                         .call(dout, invvar, input_or_output, normalized_shape, std::nullopt, epsilon,
                               memory_efficient));
}

std::vector<Tensor> rms_norm_gradient_affine(const Tensor& dout, const Tensor& invvar, const Tensor& input_or_output,
                                             at::IntArrayRef normalized_shape, const Tensor& gamma, double epsilon,
                                             bool memory_efficient) {
  auto [grad_input, grad_gamma] = op<RmsNormBwd>("apex::rms_norm_bwd")
                                      .call(dout, invvar, input_or_output, normalized_shape, gamma, epsilon,
                                            memory_efficient);
  return {grad_input, grad_gamma};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Fused LayerNorm / RMSNorm (NVIDIA apex's fused_layer_norm_cuda interface; CPU and CUDA tensors)";
  m.def("forward", &layer_norm, "LayerNorm forward -> [output, mean, invvar]");
  m.def("forward_affine", &layer_norm_affine, "LayerNorm forward with gamma/beta -> [output, mean, invvar]");
  m.def("forward_affine_mixed_dtypes", &layer_norm_affine_mixed_dtypes,
        "LayerNorm forward, output in gamma's dtype -> [output, mean, invvar]");
  m.def("backward", &layer_norm_gradient, "LayerNorm backward -> grad_input");
  m.def("backward_affine", &layer_norm_gradient_affine,
        "LayerNorm backward -> [grad_input, grad_gamma, grad_beta]");
  m.def("rms_forward", &rms_norm, "RMSNorm forward -> [output, invvar]");
  m.def("rms_forward_affine", &rms_norm_affine, "RMSNorm forward with gamma -> [output, invvar]");
  m.def("rms_forward_affine_mixed_dtypes", &rms_norm_affine_mixed_dtypes,
        "RMSNorm forward, output in gamma's dtype -> [output, invvar]");
  m.def("rms_backward", &rms_norm_gradient, "RMSNorm backward -> grad_input");
  m.def("rms_backward_affine", &rms_norm_gradient_affine, "RMSNorm backward -> [grad_input, grad_gamma]");
}
