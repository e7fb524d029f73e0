// fused_dense: NVIDIA apex's fused_dense_cuda linear + GELU + linear forward, differentiable (its C++
// formula calls the backward op, gelu_dense_backward.cpp). Inputs are [..., in_features] (upstream: 2-D
// only), any strides.
#include <array>
#include <string>

#include "apex/autograd.h"
#include "arguments.h"
#include "backward_ops.h"
#include "gemm.h"

namespace apex::fused_dense {

// (output1, output2, gelu_in): gelu_in = input @ weight1^T + bias1, output1 = gelu(gelu_in),
// output2 = output1 @ weight2^T + bias2, as NVIDIA apex returns them. GELU is exact by default
// (torch's nn.GELU(); upstream fused cuBLASLt's tanh approximation, apex #1394 / #1605), or
// approximate='tanh' (fused into the first GEMM for 16-bit data). Differentiable in output2.
struct GeluForward {
  static constexpr const char* kSchema =
      "fused_dense_linear_gelu_linear_forward(Tensor input, Tensor weight1, Tensor? bias1, Tensor weight2, "
      "Tensor? bias2, str approximate='none') -> (Tensor, Tensor, Tensor)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> call(const at::Tensor& input, const at::Tensor& weight1,
                                                             const std::optional<at::Tensor>& bias1,
                                                             const at::Tensor& weight2,
                                                             const std::optional<at::Tensor>& bias2,
                                                             c10::string_view approximate) {
    constexpr const char* op = "fused_dense_linear_gelu_linear_forward";
    const Activation gelu = gelu_of(op, approximate);
    check_input(op, "input", input);
    check_weight(op, "weight1", weight1, input.sym_size(-1), input);
    check_bias(op, "bias1", bias1, weight1.sym_size(0), input);
    check_weight(op, "weight2", weight2, weight1.sym_size(0), input);
    check_bias(op, "bias2", bias2, weight2.sym_size(0), input);
    at::Tensor output1 = empty_features(input, weight1.sym_size(0));
    at::Tensor gelu_in = empty_features(input, weight1.sym_size(0));
    at::Tensor output2 = empty_features(input, weight2.sym_size(0));
    launch<Device>(input, [&](const auto& device) {
      const at::Tensor b1 = bias1.has_value() ? bias1->contiguous() : at::Tensor();
      const at::Tensor b2 = bias2.has_value() ? bias2->contiguous() : at::Tensor();
      const at::Tensor hidden = as_matrix(output1), pre = as_matrix(gelu_in);
      matmul_bias_activation(device, as_matrix(input), weight1.t(), hidden, b1.defined() ? &b1 : nullptr, gelu, &pre);
      matmul_bias_activation(device, hidden, weight2.t(), as_matrix(output2), b2.defined() ? &b2 : nullptr,
                             Activation::kNone, nullptr);
    });
    return {output1, output2, gelu_in};
  }

  static void save(AutogradContext& ctx, const at::Tensor& input, const at::Tensor& weight1,
                   const std::optional<at::Tensor>& bias1, const at::Tensor& weight2,
                   const std::optional<at::Tensor>& bias2, c10::string_view approximate,
                   const std::tuple<at::Tensor, at::Tensor, at::Tensor>& outputs) {
    const auto& [output1, output2, gelu_in] = outputs;
    ctx.save_for_backward({input, weight1, weight2, gelu_in, output1});
    ctx.saved_data["approximate"] = std::string(approximate);
    ctx.saved_data["bias1"] = bias1.has_value();
    ctx.saved_data["bias2"] = bias2.has_value();
    ctx.mark_non_differentiable({output1, gelu_in});
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[1].defined()) return {};
    const auto needed = grads_needed(ctx, {true, true, ctx.saved_data["bias1"].toBool(), true,
                                           ctx.saved_data["bias2"].toBool()});
    const auto saved = ctx.get_saved_variables();
    auto [grad_input, grad_weight1, grad_bias1, grad_weight2, grad_bias2] = call_op<GeluBackward>(
        saved[0], saved[3], saved[4], saved[1], saved[2], grads[1], ctx.saved_data["approximate"].toStringRef(),
        std::array<bool, 5>{needed[0], needed[1], needed[2], needed[3], needed[4]});
    auto keep = [&](size_t i, at::Tensor& grad) { return needed[i] ? grad : at::Tensor(); };
    return {keep(0, grad_input), keep(1, grad_weight1), keep(2, grad_bias1), keep(3, grad_weight2),
            keep(4, grad_bias2)};
  }
};

APEX_LIBRARY(m) { define_differentiable<GeluForward>(m); }

}  // namespace apex::fused_dense
