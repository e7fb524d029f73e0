// fused_dense: mlp_backward, NVIDIA apex's mlp_cuda.backward (declared in backward_ops.h).
#include "apex/op.h"
#include "arguments.h"
#include "backward_ops.h"
#include "gemm.h"

namespace apex::fused_dense {

template <class Device>
std::vector<at::Tensor> MlpBackward::call(int64_t use_bias, int64_t activation, const at::Tensor& grad_o,
                                          at::TensorList fprop_outputs, at::TensorList inputs, bool input_grad) {
  constexpr const char* op = "mlp_backward";
  const Activation act = mlp_activation(activation);
  const int64_t layers = check_mlp(op, use_bias, inputs);
  const at::Tensor& input = inputs[0];
  APEX_CHECK(fprop_outputs.size() == static_cast<size_t>(layers), op,
             ": fprop_outputs must be mlp_forward's outputs (", layers, " tensors), got ", fprop_outputs.size());
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor& saved = fprop_outputs[l == layers - 1 ? 0 : l + 1];  // [output, hidden_0, ...]
    check_grad(op, "fprop_outputs", saved, input, inputs[1 + l].sym_size(0));
  }
  check_grad(op, "grad_o", grad_o, input, inputs[layers].sym_size(0));
  std::vector<at::Tensor> grads;
  grads.push_back(input_grad ? at::empty_symint(input.sym_sizes(), input.options()) : unrequested(input));
  for (size_t i = 1; i < inputs.size(); ++i) grads.push_back(at::empty_symint(inputs[i].sym_sizes(), input.options()));
  launch<Device>(input, [&](const auto& device) {
    auto activation_of = [&](int64_t l) { return as_matrix(fprop_outputs[l == layers - 1 ? 0 : l + 1]).contiguous(); };
    // grad_z: the gradient at layer l's pre-activation, from the last layer down.
    at::Tensor grad_z = as_matrix(grad_o).contiguous();
    if (act != Activation::kNone) {
      at::Tensor scaled = at::empty_like(grad_z);
      activation_grad(device, ActivationGradArgs{grad_z.const_data_ptr(), activation_of(layers - 1).const_data_ptr(),
                                                 scaled.mutable_data_ptr(), scaled.numel(),
                                                 floating_dtype(scaled, op, "grad_o"), act});
      grad_z = scaled;
    }
    for (int64_t l = layers - 1; l >= 0; --l) {
      const at::Tensor below = l == 0 ? as_matrix(input) : activation_of(l - 1);
      linear_param_grads(grad_z, below, &grads[1 + l], use_bias ? &grads[1 + layers + l] : nullptr);
      const at::Tensor& weight = inputs[1 + l];
      if (l > 0) {
        at::Tensor grad_below = at::empty_like(below);
        matmul_activation_grad(device, grad_z, weight, grad_below, act, below);
        grad_z = grad_below;
      } else if (input_grad) {
        matmul(grad_z, weight, as_matrix(grads[0]));
      }
    }
  });
  return grads;
}

APEX_LIBRARY(m) { define<MlpBackward>(m); }

}  // namespace apex::fused_dense
