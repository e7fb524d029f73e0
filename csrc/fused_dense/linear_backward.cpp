// fused_dense: fused_dense_linear_bias_backward, NVIDIA apex's linear_bias_backward (declared in backward_ops.h).
#include "apex/op.h"
#include "arguments.h"
#include "backward_ops.h"
#include "gemm.h"

namespace apex::fused_dense {

template <class Device>
std::tuple<at::Tensor, at::Tensor, at::Tensor> LinearBackward::call(const at::Tensor& input, const at::Tensor& weight,
                                                                    const at::Tensor& d_output, std::array<bool, 3> mask) {
  constexpr const char* op = "fused_dense_linear_bias_backward";
  check_input(op, "input", input);
  check_weight(op, "weight", weight, input.sym_size(-1), input);
  check_grad(op, "d_output", d_output, input, weight.sym_size(0));
  at::Tensor grad_input = mask[0] ? at::empty_symint(input.sym_sizes(), input.options()) : unrequested(input);
  at::Tensor grad_weight = mask[1] ? at::empty_symint(weight.sym_sizes(), weight.options()) : unrequested(input);
  at::Tensor grad_bias = mask[2] ? at::empty_symint({weight.sym_size(0)}, weight.options()) : unrequested(input);
  launch<Device>(input, [&](const auto&) {
    const at::Tensor grad = as_matrix(d_output);
    if (mask[0]) matmul(grad, weight, as_matrix(grad_input));
    linear_param_grads(grad, as_matrix(input), mask[1] ? &grad_weight : nullptr, mask[2] ? &grad_bias : nullptr);
  });
  return {grad_input, grad_weight, grad_bias};
}

APEX_LIBRARY(m) { define<LinearBackward>(m); }

}  // namespace apex::fused_dense
