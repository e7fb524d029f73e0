#pragma once
// fused_dense: the argument checks and shapes the op functions share. Every check runs before any
// launch (and in the Meta kernels, on symbolic sizes).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "apex/op.h"
#include "dense.h"

namespace apex::fused_dense {

// A linear layer's input [..., in_features] (at least 1-D) in a floating dtype: its kernel Dtype.
inline Dtype check_input(const char* op, const char* name, const at::Tensor& input) {
  APEX_CHECK(input.dim() >= 1, op, ": ", name, " must be at least 1-D [..., features], got a 0-D tensor");
  return floating_dtype(input, op, name);
}

// weight [out_features, in_features] of `like`'s dtype and device.
inline void check_weight(const char* op, const char* name, const at::Tensor& weight, const c10::SymInt& in_features,
                         const at::Tensor& like) {
  APEX_CHECK(weight.dim() == 2, op, ": ", name, " must be 2-D [out_features, in_features], got shape ",
             weight.sym_sizes());
  APEX_CHECK(weight.sym_size(1) == in_features, op, ": ", name, " must have ", in_features,
             " columns (in_features), got shape ", weight.sym_sizes());
  APEX_CHECK(weight.scalar_type() == like.scalar_type(), op, ": ", name, " must have the input's dtype ",
             like.scalar_type(), ", got ", weight.scalar_type());
  check_same_device(weight, like, op, name, "input");
}

// bias [out_features] of `like`'s dtype and device, when given.
inline void check_bias(const char* op, const char* name, const std::optional<at::Tensor>& bias,
                       const c10::SymInt& out_features, const at::Tensor& like) {
  if (!bias.has_value()) return;
  APEX_CHECK(bias->dim() == 1 && bias->sym_size(0) == out_features, op, ": ", name, " must have shape [",
             out_features, "], got ", bias->sym_sizes());
  APEX_CHECK(bias->scalar_type() == like.scalar_type(), op, ": ", name, " must have the input's dtype ",
             like.scalar_type(), ", got ", bias->scalar_type());
  check_same_device(*bias, like, op, name, "input");
}

// A gradient of an output [..., features] whose leading sizes are input's.
inline void check_grad(const char* op, const char* name, const at::Tensor& grad, const at::Tensor& input,
                       const c10::SymInt& features) {
  APEX_CHECK(grad.dim() == input.dim() && grad.sym_sizes().slice(0, grad.dim() - 1).equals(
                                              input.sym_sizes().slice(0, input.dim() - 1)) &&
                 grad.sym_size(-1) == features,
             op, ": ", name, " must have shape ", input.sym_sizes().slice(0, input.dim() - 1), " + [", features,
             "], got ", grad.sym_sizes());
  APEX_CHECK(grad.scalar_type() == input.scalar_type(), op, ": ", name, " must have the input's dtype ",
             input.scalar_type(), ", got ", grad.scalar_type());
  check_same_device(grad, input, op, name, "input");
}

// The sizes of t with its last one replaced: a linear layer's output sizes [..., features].
inline std::vector<c10::SymInt> with_features(const at::Tensor& t, const c10::SymInt& features) {
  std::vector<c10::SymInt> sizes(t.sym_sizes().begin(), t.sym_sizes().end());
  sizes.back() = features;
  return sizes;
}

inline at::Tensor empty_features(const at::Tensor& like, const c10::SymInt& features) {
  return at::empty_symint(with_features(like, features), like.options());
}

// t [..., features] as the matrix [tokens, features] BLAS multiplies (a view where possible).
// Real tensors only (inside launch<>).
inline at::Tensor as_matrix(const at::Tensor& t) {
  int64_t tokens = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) tokens *= t.size(d);
  return t.reshape({tokens, t.size(-1)});
}

// An output the caller did not ask for (output_mask): empty, never computed.
inline at::Tensor unrequested(const at::Tensor& like) { return at::empty({0}, like.options()); }

// Which of a differentiable op's tensor arguments need a gradient, in argument order: `present` says
// which were given (absent optional tensors have no autograd input slot). Context is torch's
// AutogradContext (a template parameter, so that this header need not include autograd's).
template <class Context>
std::vector<bool> grads_needed(const Context& ctx, std::initializer_list<bool> present) {
  std::vector<bool> needed;
  size_t slot = 0;
  for (const bool given : present) needed.push_back(given && ctx.needs_input_grad(slot++));
  return needed;
}

// "none" (erf, torch's default) or "tanh", as torch.nn.functional.gelu's `approximate`.
inline Activation gelu_of(const char* op, c10::string_view approximate) {
  if (approximate == "none") return Activation::kGelu;
  if (approximate == "tanh") return Activation::kGeluTanh;
  APEX_CHECK(false, op, ": approximate must be 'none' or 'tanh', got '", std::string(approximate), "'");
  return Activation::kGelu;
}

// fused_dense_activation_bias_grad's activation names: "none", "relu", "sigmoid", "gelu" (exact, erf) or
// "gelu_tanh" (the tanh approximation).
inline Activation activation_named(const char* op, c10::string_view name) {
  if (name == "none") return Activation::kNone;
  if (name == "relu") return Activation::kRelu;
  if (name == "sigmoid") return Activation::kSigmoid;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_tanh") return Activation::kGeluTanh;
  APEX_CHECK(false, op, ": activation must be 'none', 'relu', 'sigmoid', 'gelu' or 'gelu_tanh', got '",
             std::string(name), "'");
  return Activation::kNone;
}

// apex.mlp's activation numbers.
inline Activation mlp_activation(int64_t activation) {
  APEX_CHECK(activation >= 0 && activation <= 2, "mlp: activation must be 0 (none), 1 (relu) or 2 (sigmoid), got ",
             activation);
  constexpr Activation kByNumber[] = {Activation::kNone, Activation::kRelu, Activation::kSigmoid};
  return kByNumber[activation];
}

// inputs = [input, weight_0 .. weight_{L-1}, (bias_0 .. bias_{L-1} when use_bias)]: L, checked.
inline int64_t check_mlp(const char* op, int64_t use_bias, at::TensorList inputs) {
  APEX_CHECK(use_bias == 0 || use_bias == 1, op, ": use_bias must be 0 or 1, got ", use_bias);
  const int64_t per_layer = 1 + use_bias;
  APEX_CHECK(inputs.size() >= static_cast<size_t>(1 + per_layer) && (inputs.size() - 1) % per_layer == 0, op,
             ": inputs must be [input, weights...", use_bias ? ", biases...]" : "]", ", got ", inputs.size(),
             " tensors");
  const int64_t layers = static_cast<int64_t>(inputs.size() - 1) / per_layer;
  const at::Tensor& input = inputs[0];
  check_input(op, "input", input);
  c10::SymInt features = input.sym_size(-1);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string weight = "weight_" + std::to_string(l), bias = "bias_" + std::to_string(l);
    check_weight(op, weight.c_str(), inputs[1 + l], features, input);
    features = inputs[1 + l].sym_size(0);
    if (use_bias) check_bias(op, bias.c_str(), inputs[1 + layers + l], features, input);
  }
  return layers;
}

}  // namespace apex::fused_dense
