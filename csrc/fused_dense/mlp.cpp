// fused_dense: NVIDIA apex's mlp_cuda forward: a stack of linear layers, each followed by the same
// activation (none, ReLU or sigmoid), over all layers in one op, differentiable (its C++ formula calls
// mlp_backward, mlp_backward.cpp). ReLU and the bias ride in the GEMMs' cuBLASLt epilogue (gemm.h says
// why the backward has none).
#include <string>
#include <vector>

#include "apex/autograd.h"
#include "arguments.h"
#include "backward_ops.h"
#include "gemm.h"

namespace apex::fused_dense {
namespace {

const at::Tensor* bias_of(int64_t use_bias, at::TensorList inputs, int64_t layers, int64_t layer) {
  return use_bias ? &inputs[1 + layers + layer] : nullptr;
}

}  // namespace

// [output, hidden_0, .., hidden_{L-2}]: output = layer_{L-1}(.. layer_0(input)), layer_l(x) =
// activation(x @ weight_l^T + bias_l); the hidden activations are what backward reads (upstream
// packed them into one "reserved space" tensor; pass the list back to mlp_backward as it came).
struct MlpForward {
  static constexpr const char* kSchema = "mlp_forward(int use_bias, int activation, Tensor[] inputs) -> Tensor[]";

  template <class Device>
  static std::vector<at::Tensor> call(int64_t use_bias, int64_t activation, at::TensorList inputs) {
    constexpr const char* op = "mlp_forward";
    const Activation act = mlp_activation(activation);
    const int64_t layers = check_mlp(op, use_bias, inputs);
    const at::Tensor& input = inputs[0];
    std::vector<at::Tensor> outputs{empty_features(input, inputs[layers].sym_size(0))};
    for (int64_t l = 0; l + 1 < layers; ++l) outputs.push_back(empty_features(input, inputs[1 + l].sym_size(0)));
    launch<Device>(input, [&](const auto& device) {
      at::Tensor x = as_matrix(input);
      for (int64_t l = 0; l < layers; ++l) {
        const at::Tensor y = as_matrix(outputs[l == layers - 1 ? 0 : l + 1]);
        const at::Tensor* bias = bias_of(use_bias, inputs, layers, l);
        const at::Tensor b = bias ? bias->contiguous() : at::Tensor();
        matmul_bias_activation(device, x, inputs[1 + l].t(), y, bias ? &b : nullptr, act, nullptr);
        x = y;
      }
    });
    return outputs;
  }

  // Differentiable in every tensor of `inputs`; backward reads the inputs and the hidden outputs.
  static void save(AutogradContext& ctx, int64_t use_bias, int64_t activation, at::TensorList inputs,
                   const std::vector<at::Tensor>& outputs) {
    std::vector<at::Tensor> saved(inputs.begin(), inputs.end());
    saved.insert(saved.end(), outputs.begin(), outputs.end());
    ctx.save_for_backward(saved);
    ctx.saved_data["use_bias"] = use_bias;
    ctx.saved_data["activation"] = activation;
    ctx.saved_data["inputs"] = static_cast<int64_t>(inputs.size());
    ctx.mark_non_differentiable(std::vector<at::Tensor>(outputs.begin() + 1, outputs.end()));
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[0].defined()) return {};
    const int64_t count = ctx.saved_data["inputs"].toInt();
    const auto saved = ctx.get_saved_variables();
    const std::vector<at::Tensor> inputs(saved.begin(), saved.begin() + count);
    const std::vector<at::Tensor> outputs(saved.begin() + count, saved.end());
    std::vector<at::Tensor> computed = call_op<MlpBackward>(ctx.saved_data["use_bias"].toInt(),
                                                            ctx.saved_data["activation"].toInt(), grads[0], outputs,
                                                            inputs, ctx.needs_input_grad(0));
    Grads result(2);  // none for use_bias and activation
    for (int64_t i = 0; i < count; ++i) result.push_back(ctx.needs_input_grad(i) ? computed[i] : at::Tensor());
    return result;
  }
};

APEX_LIBRARY(m) { define_differentiable<MlpForward>(m); }

}  // namespace apex::fused_dense
