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
    auto grad_bias_of = [&](int64_t l) { return use_bias ? &grads[1 + layers + l] : nullptr; };
    // grad_z: the gradient at layer l's pre-activation, from the last layer down. Each layer's bias
    // gradient is taken in the pass that makes grad_z (bias_grad.h): the activation derivative's, or,
    // without an activation, a column sum alone.
    at::Tensor grad_z = as_matrix(grad_o).contiguous();
    const at::Tensor top = act == Activation::kNone ? grad_z : at::empty_like(grad_z);
    pre_activation_grads(device, grad_z, activation_of(layers - 1), act, &top, grad_bias_of(layers - 1));
    grad_z = top;
    for (int64_t l = layers - 1; l >= 0; --l) {
      const at::Tensor below = l == 0 ? as_matrix(input) : activation_of(l - 1);
      linear_param_grads(grad_z, below, &grads[1 + l], nullptr);
      const at::Tensor& weight = inputs[1 + l];
      if (l > 0) {
        at::Tensor grad_below = at::empty_like(below);
        matmul_activation_grad(device, grad_z, weight, grad_below, act, below, grad_bias_of(l - 1));
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
