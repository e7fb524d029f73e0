// syncbn: the backward op of one process's step, syncbn_batch_norm_bwd, and the forward ops' autograd
// formula that calls it; see step.h.
#include <ATen/ops/empty.h>

#include <optional>

#include "step.h"

namespace apex::syncbn {

template <class Device>
std::tuple<Tensor, Tensor, Tensor, Tensor> StepBackward::call(const Tensor& grad_output, const Tensor& input,
                                                              const OptionalTensor& z, const OptionalTensor& weight,
                                                              const OptionalTensor& bias, const Tensor& mean,
                                                              const Tensor& inv_std, bool batch_statistics,
                                                              bool channels_last, bool permuted, bool fuse_relu,
                                                              std::array<bool, 3> output_mask) {
  const char* op = "syncbn_batch_norm_bwd";
  check_step_layout(op, z, channels_last, permuted, fuse_relu);
  const auto [want_input, want_z, want_parameters] = output_mask;
  const KernelOrder order{channels_last, permuted};
  const c10::SymInt channels = channels_of(op, input, order);
  // Every operand checked and converted once, here; the kernels' op functions below take them as they are.
  const Tensor x = in_kernel_order(input, order);
  const Tensor m = channel_vector(op, "mean", mean, x, channels);
  const Tensor s = channel_vector(op, "inv_std", inv_std, x, channels);
  const Tensor w = optional_channel_vector(op, "weight", weight, x, channels);
  Tensor dy = like_input(op, "grad_output", grad_output, x, order);
  if (fuse_relu) dy = normalize<Device>(op, x, z, &dy, m, s, w, bias, /*fuse_relu=*/true, order);
  const auto none = [&] { return at::empty({0}, x.options()); };  // one each: outputs never alias
  const Tensor grad_z = want_z && defined(z) ? (fuse_relu ? dy : dy.clone()) : none();
  const bool parameter_grads = want_parameters && defined(weight);
  Tensor sum_dy, sum_dy_xmu, grad_weight, grad_bias;
  if (batch_statistics || parameter_grads) {
    std::tie(sum_dy, sum_dy_xmu, grad_weight) = gradient_sums_of<Device>(op, dy, x, m, s, parameter_grads, order);
  }
  if (parameter_grads) {
    grad_weight = in_dtype(grad_weight, weight->scalar_type());
    grad_bias = in_dtype(sum_dy, weight->scalar_type());
  } else {
    grad_weight = none();
    grad_bias = none();
  }
  if (!want_input) return {none(), grad_z, grad_weight, grad_bias};
  // Constant statistics (eval): no sums, dx = dy * inv_std * weight.
  const Tensor grad_input = batch_statistics ? input_grad_of<Device>(op, dy, x, m, s, w, sum_dy, sum_dy_xmu, Tensor(),
                                                                     x.sym_numel() / channels, order)
                                             : input_grad_of<Device>(op, dy, x, m, s, w, Tensor(), Tensor(), Tensor(),
                                                                     1, order);
  return {grad_input, grad_z, grad_weight, grad_bias};
}

Grads step_grads(AutogradContext& ctx, const Grads& grads) {
  if (!grads[0].defined()) return {};
  const Grads saved = ctx.get_saved_variables();
  const Tensor &x = saved[0], &z = saved[1], &weight = saved[2], &bias = saved[3], &mean = saved[4],
               &inv_std = saved[5];
  const bool permuted = ctx.saved_data["permuted"].toBool(), fuse_relu = ctx.saved_data["fuse_relu"].toBool();
  const auto optional = [](const Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; };
  // needs_input_grad counts the tensors given: input, then z, weight and bias where given.
  size_t index = 1;
  const bool want_z = z.defined() && ctx.needs_input_grad(index++);
  bool want_parameters = weight.defined() && ctx.needs_input_grad(index++);
  if (bias.defined()) want_parameters = (ctx.needs_input_grad(index) || want_parameters) && weight.defined();
  // A plain backward records nothing: straight to the kernel, past the backward op's Autograd kernel
  // (a boxed not-implemented check). Under create_graph it goes through that check, which refuses.
  std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
  if (!at::GradMode::is_enabled()) below_autograd.emplace();
  auto [grad_input, grad_z, grad_weight, grad_bias] = call_op<StepBackward>(
      grads[0], x, optional(z), optional(weight), fuse_relu ? optional(bias) : std::nullopt, mean, inv_std,
      ctx.saved_data["batch_stats"].toBool(), ctx.saved_data["channels_last"].toBool(), permuted, fuse_relu,
      std::array<bool, 3>{ctx.needs_input_grad(0), want_z, want_parameters});
  return {ctx.needs_input_grad(0) ? grad_input : Tensor(), want_z ? grad_z : Tensor(),
          want_parameters ? grad_weight : Tensor(), want_parameters ? grad_bias : Tensor()};
}

APEX_LIBRARY(m) { define<StepBackward>(m); }

}  // namespace apex::syncbn
