// fused_dense: NVIDIA apex's fused_dense_cuda linear forward (linear + bias, and the no-bias dense),
// differentiable (its C++ formula calls the backward op, linear_backward.cpp). Inputs are
// [..., in_features] (upstream: 2-D only), any strides.
#include <array>

#include "apex/autograd.h"
#include "arguments.h"
#include "backward_ops.h"
#include "gemm.h"

namespace apex::fused_dense {

// input @ weight^T + bias (bias optional: upstream's no-bias dense too). Differentiable.
struct LinearForward {
  static constexpr const char* kSchema =
      "fused_dense_linear_bias_forward(Tensor input, Tensor weight, Tensor? bias) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
    constexpr const char* op = "fused_dense_linear_bias_forward";
    check_input(op, "input", input);
    check_weight(op, "weight", weight, input.sym_size(-1), input);
    check_bias(op, "bias", bias, weight.sym_size(0), input);
    at::Tensor output = empty_features(input, weight.sym_size(0));
    launch<Device>(input, [&](const auto& device) {
      const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
      matmul_bias_activation(device, as_matrix(input), weight.t(), as_matrix(output), b.defined() ? &b : nullptr,
                             Activation::kNone, nullptr);
    });
    return output;
  }

  static void save(AutogradContext& ctx, const at::Tensor& input, const at::Tensor& weight,
                   const std::optional<at::Tensor>& bias, const at::Tensor& /*output*/) {
    ctx.save_for_backward({input, weight});
    ctx.saved_data["bias"] = bias.has_value();
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[0].defined()) return {};
    const auto needed = grads_needed(ctx, {true, true, ctx.saved_data["bias"].toBool()});
    const auto saved = ctx.get_saved_variables();
    auto [grad_input, grad_weight, grad_bias] =
        call_op<LinearBackward>(saved[0], saved[1], grads[0], std::array<bool, 3>{needed[0], needed[1], needed[2]});
    return {needed[0] ? grad_input : at::Tensor(), needed[1] ? grad_weight : at::Tensor(),
            needed[2] ? grad_bias : at::Tensor()};
  }
};

APEX_LIBRARY(m) { define_differentiable<LinearForward>(m); }

}  // namespace apex::fused_dense
