// fused_dense: fused_dense_linear_gelu_linear_backward, NVIDIA apex's linear_gelu_linear_backward (declared in backward_ops.h).
#include "apex/op.h"
#include "arguments.h"
#include "backward_ops.h"
#include "gemm.h"

namespace apex::fused_dense {

template <class Device>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> GeluBackward::call(
    const at::Tensor& input, const at::Tensor& gelu_in, const at::Tensor& output1, const at::Tensor& weight1,
    const at::Tensor& weight2, const at::Tensor& d_output2, c10::string_view approximate, std::array<bool, 5> mask) {
  constexpr const char* op = "fused_dense_linear_gelu_linear_backward";
  const Activation gelu = gelu_of(op, approximate);
  check_input(op, "input", input);
  check_weight(op, "weight1", weight1, input.sym_size(-1), input);
  check_weight(op, "weight2", weight2, weight1.sym_size(0), input);
  check_grad(op, "gelu_in", gelu_in, input, weight1.sym_size(0));
  check_grad(op, "output1", output1, input, weight1.sym_size(0));
  check_grad(op, "d_output2", d_output2, input, weight2.sym_size(0));
  auto make = [&](bool wanted, c10::SymIntArrayRef sizes) {
    return wanted ? at::empty_symint(sizes, input.options()) : unrequested(input);
  };
  at::Tensor grad_input = make(mask[0], input.sym_sizes());
  at::Tensor grad_weight1 = make(mask[1], weight1.sym_sizes());
  at::Tensor grad_bias1 = make(mask[2], weight1.sym_sizes().slice(0, 1));
  at::Tensor grad_weight2 = make(mask[3], weight2.sym_sizes());
  at::Tensor grad_bias2 = make(mask[4], weight2.sym_sizes().slice(0, 1));
  launch<Device>(input, [&](const auto& device) {
    const at::Tensor grad2 = as_matrix(d_output2);
    linear_param_grads(grad2, as_matrix(output1), mask[3] ? &grad_weight2 : nullptr, mask[4] ? &grad_bias2 : nullptr);
    if (!(mask[0] || mask[1] || mask[2])) return;
    const at::Tensor pre = as_matrix(gelu_in).contiguous();
    // The gradient at GELU's input, and bias1's (its column sums) in the same pass.
    at::Tensor grad_pre = at::empty_like(pre);
    matmul_activation_grad(device, grad2, weight2, grad_pre, gelu, pre, mask[2] ? &grad_bias1 : nullptr);
    linear_param_grads(grad_pre, as_matrix(input), mask[1] ? &grad_weight1 : nullptr, nullptr);
    if (mask[0]) matmul(grad_pre, weight1, as_matrix(grad_input));
  });
  return {grad_input, grad_weight1, grad_bias1, grad_weight2, grad_bias2};
}

APEX_LIBRARY(m) { define<GeluBackward>(m); }

}  // namespace apex::fused_dense
