// syncbn: one process's eval step, syncbn_batch_norm_eval (and its first output alone); see step.h.
#include <ATen/ops/empty.h>

#include "step.h"

namespace apex::syncbn {
namespace {

// Batch norm with running statistics (eval): (output, 1 / sqrt(running_var + eps)). Differentiable in
// input, z, weight and bias; the statistics are constants.
struct BatchNormEval {
  static constexpr const char* kSchema =
      "syncbn_batch_norm_eval(Tensor input, Tensor? z, Tensor? weight, Tensor? bias, Tensor running_mean, "
      "Tensor running_var, float eps, bool channels_last, bool permuted, bool fuse_relu) "
      "-> (Tensor output, Tensor inv_std)";

  template <class Device>
  static std::tuple<Tensor, Tensor> call(const Tensor& input, const OptionalTensor& z, const OptionalTensor& weight,
                                         const OptionalTensor& bias, const Tensor& running_mean,
                                         const Tensor& running_var, double eps, bool channels_last, bool permuted,
                                         bool fuse_relu) {
    const char* op = "syncbn_batch_norm_eval";
    check_step_layout(op, z, channels_last, permuted, fuse_relu);
    const KernelOrder order{channels_last, permuted};
    const c10::SymInt channels = channels_of(op, input, order);
    const Tensor x = in_kernel_order(input, order);
    const Tensor mean = channel_vector(op, "running_mean", running_mean, x, channels);
    const Tensor var = channel_vector(op, "running_var", running_var, x, channels);
    // By a kernel, not as rsqrt(var + eps): two ATen ops (and the scalar's conversion) per call.
    Tensor inv_std = at::empty_symint({channels}, var.options());
    launch<Device>(var, [&](const auto& device) {
      inverse_std(device, InverseStdArgs{var.const_data_ptr(), inv_std.mutable_data_ptr(), var.numel(),
                                         floating_dtype(var, op, "running_var"), eps});
    });
    return {normalize<Device>(op, x, z, nullptr, mean, inv_std, weight, bias, fuse_relu, order), inv_std};
  }

  static void save(AutogradContext& ctx, const Tensor& input, const OptionalTensor& z, const OptionalTensor& weight,
                   const OptionalTensor& bias, const Tensor& running_mean, const Tensor& /*running_var*/,
                   double /*eps*/, bool channels_last, bool permuted, bool fuse_relu,
                   const std::tuple<Tensor, Tensor>& outputs) {
    const auto& [output, inv_std] = outputs;
    save_step(ctx, input, z, weight, bias, running_mean.to(inv_std.scalar_type()), inv_std,
              /*batch_statistics=*/false, channels_last, permuted, fuse_relu);
    ctx.mark_non_differentiable({inv_std});
  }

  static Grads backward(AutogradContext& ctx, Grads grads) { return step_grads(ctx, grads); }
};

}  // namespace

APEX_LIBRARY(m) {
  define_differentiable<BatchNormEval>(m);
  define_first_output<BatchNormEval>(m);  // the eager Python calls
}

}  // namespace apex::syncbn
