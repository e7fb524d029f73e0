// fused_dense: fused_dense_activation_bias_grad, the backward's activation-and-bias gradient pass
// (bias_grad.h) as an op of its own: what mlp_backward and the GELU block's backward run on their data
// gradient GEMM's output, for code with GEMMs of its own (and the tests and benchmarks of the pass).
#include <array>
#include <optional>
#include <tuple>

#include "apex/op.h"
#include "arguments.h"
#include "gemm.h"

namespace apex::fused_dense {

// (grad_input, grad_bias) from grad [..., features], the gradient at an activation's output:
// grad_input = grad * activation'(saved) and grad_bias [features] = grad_input summed over every
// leading index (of grad_input's values as stored, in float32 for 16-bit data, as eager's
// grad_input.sum(0)), each where output_mask asks (the other comes back empty). saved, of grad's shape,
// is the activation's input for gelu and gelu_tanh, its output for relu and sigmoid, and may be None
// for none (grad_input is then grad's copy, grad_bias its column sums). Deterministic. Any strides.
struct ActivationBiasGrad {
  static constexpr const char* kSchema =
      "fused_dense_activation_bias_grad(Tensor grad, Tensor? saved, str activation='none', "
      "bool[2] output_mask=[True, True]) -> (Tensor, Tensor)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(const at::Tensor& grad, const std::optional<at::Tensor>& saved,
                                                 c10::string_view activation, std::array<bool, 2> mask) {
    constexpr const char* op = "fused_dense_activation_bias_grad";
    const Activation act = activation_named(op, activation);
    check_input(op, "grad", grad);
    const bool saves_input = act == Activation::kGelu || act == Activation::kGeluTanh;
    APEX_CHECK(saved.has_value() || act == Activation::kNone, op, ": activation '", std::string(activation),
               "' needs saved (the activation's ", saves_input ? "input" : "output", ")");
    if (saved.has_value()) {
      APEX_CHECK(saved->sym_sizes().equals(grad.sym_sizes()), op, ": saved must have grad's shape ", grad.sym_sizes(),
                 ", got ", saved->sym_sizes());
      APEX_CHECK(saved->scalar_type() == grad.scalar_type(), op, ": saved must have grad's dtype ", grad.scalar_type(),
                 ", got ", saved->scalar_type());
      check_same_device(*saved, grad, op, "saved", "grad");
    }
    at::Tensor grad_input = mask[0] ? at::empty_symint(grad.sym_sizes(), grad.options()) : unrequested(grad);
    at::Tensor grad_bias = mask[1] ? at::empty_symint({grad.sym_size(-1)}, grad.options()) : unrequested(grad);
    launch<Device>(grad, [&](const auto& device) {
      const at::Tensor g = as_matrix(grad).contiguous();
      const at::Tensor s = saved.has_value() ? as_matrix(*saved).contiguous() : g;
      const at::Tensor out = mask[0] ? as_matrix(grad_input) : at::Tensor();
      pre_activation_grads(device, g, s, act, mask[0] ? &out : nullptr, mask[1] ? &grad_bias : nullptr);
    });
    return {grad_input, grad_bias};
  }
};

APEX_LIBRARY(m) { define<ActivationBiasGrad>(m); }

}  // namespace apex::fused_dense
