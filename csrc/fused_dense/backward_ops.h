#pragma once
// fused_dense: the backward ops, declared here for the differentiable forward ops, whose C++ formulas
// call them through apex::call_op, and defined each in its own *_backward.cpp. Why apart: the files of
// the forward ops include apex/autograd.h (torch's autograd headers: the heaviest parse of the build),
// the backward files only apex/op.h, and each file is a translation unit of its own, so that a
// parallel build of the library takes about the time of its slowest (lightest possible) unit.
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <array>
#include <cstdint>
#include <tuple>
#include <vector>

namespace apex::fused_dense {

// (grad_input, grad_weight, grad_bias) of fused_dense_linear_bias_forward; output_mask picks which
// are computed (the others come back empty).
struct LinearBackward {
  static constexpr const char* kSchema =
      "fused_dense_linear_bias_backward(Tensor input, Tensor weight, Tensor d_output, "
      "bool[3] output_mask=[True, True, True]) -> (Tensor, Tensor, Tensor)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> call(const at::Tensor& input, const at::Tensor& weight,
                                                             const at::Tensor& d_output, std::array<bool, 3> mask);
};

// (grad_input, grad_weight1, grad_bias1, grad_weight2, grad_bias2) of
// fused_dense_linear_gelu_linear_forward, from its saved gelu_in and output1.
struct GeluBackward {
  static constexpr const char* kSchema =
      "fused_dense_linear_gelu_linear_backward(Tensor input, Tensor gelu_in, Tensor output1, Tensor weight1, "
      "Tensor weight2, Tensor d_output2, str approximate='none', bool[5] output_mask=[True, True, True, True, True]) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> call(
      const at::Tensor& input, const at::Tensor& gelu_in, const at::Tensor& output1, const at::Tensor& weight1,
      const at::Tensor& weight2, const at::Tensor& d_output2, c10::string_view approximate, std::array<bool, 5> mask);
};

// Gradients of mlp_forward: [grad_input, grad_weight_0 .., (grad_bias_0 ..)] in inputs' order, from
// grad_o (the output's gradient) and fprop_outputs (mlp_forward's outputs). grad_input is left empty
// when input_grad is false.
struct MlpBackward {
  static constexpr const char* kSchema =
      "mlp_backward(int use_bias, int activation, Tensor grad_o, Tensor[] fprop_outputs, Tensor[] inputs, "
      "bool input_grad=True) -> Tensor[]";

  template <class Device>
  static std::vector<at::Tensor> call(int64_t use_bias, int64_t activation, const at::Tensor& grad_o,
                                      at::TensorList fprop_outputs, at::TensorList inputs, bool input_grad);
};

}  // namespace apex::fused_dense
