// syncbn: one process's training step, syncbn_batch_norm (and its first output alone); see step.h.
#include <ATen/ops/empty.h>
#include <ATen/ops/lerp.h>

#include "step.h"

namespace apex::syncbn {
namespace {

// Batch norm of one process's batch with its own statistics, + z and relu when asked: (output, mean,
// unbiased var, 1 / sqrt(biased var + eps)), the statistics per channel in the statistics dtype.
// running_mean / running_var, when given, move toward the batch's mean and unbiased variance by
// `momentum` (torch.nn.BatchNorm's update). Differentiable in input, z, weight and bias.
struct BatchNormTrain {
  static constexpr const char* kSchema =
      "syncbn_batch_norm(Tensor input, Tensor? z, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
      "Tensor(b!)? running_var, float momentum, float eps, bool channels_last, bool permuted, bool fuse_relu) "
      "-> (Tensor output, Tensor mean, Tensor var, Tensor inv_std)";

  template <class Device>
  static std::tuple<Tensor, Tensor, Tensor, Tensor> call(const Tensor& input, const OptionalTensor& z,
                                                         const OptionalTensor& weight, const OptionalTensor& bias,
                                                         const OptionalTensor& running_mean,
                                                         const OptionalTensor& running_var, double momentum,
                                                         double eps, bool channels_last, bool permuted,
                                                         bool fuse_relu) {
    const char* op = "syncbn_batch_norm";
    check_step_layout(op, z, channels_last, permuted, fuse_relu);
    const KernelOrder order{channels_last, permuted};
    const c10::SymInt channels = channels_of(op, input, order);
    const c10::SymInt elements = input.sym_numel() / channels;  // per channel
    TORCH_CHECK_VALUE(holds(elements.sym_gt(1)), message("SyncBatchNorm: expected more than 1 value per channel when "
                                                         "training, got input of shape ", input.sym_sizes()));
    APEX_CHECK(defined(running_mean) == defined(running_var), op, ": give both running statistics or neither");
    const Tensor x = in_kernel_order(input, order);
    const Tensor stats = running_statistics(op, running_mean, x, channels);
    const Tensor stats_var = running_statistics(op, running_var, x, channels);
    auto [local_mean, local_var] = mean_var<Device>(x, order);
    const auto statistics = local_mean.options();
    Tensor mean = at::empty_symint({channels}, statistics), var = at::empty_symint({channels}, statistics),
           inv_std = at::empty_symint({channels}, statistics);
    // The merge kernel updates running statistics it can write as they are (contiguous, statistics
    // dtype); others (a module converted to half, say) are updated from its results.
    const bool in_kernel = stats.defined() && stats.is_same(*running_mean) && stats_var.is_same(*running_var);
    launch<Device>(local_mean, [&](const auto& device) {
      welford_parallel(device, MergeArgs{local_mean.const_data_ptr(), local_var.const_data_ptr(), /*count*/ nullptr,
                                         elements.expect_int(), mean.mutable_data_ptr(), var.mutable_data_ptr(),
                                         inv_std.mutable_data_ptr(),
                                         in_kernel ? running_mean->mutable_data_ptr() : nullptr,
                                         in_kernel ? running_var->mutable_data_ptr() : nullptr, /*world*/ 1,
                                         local_mean.numel(), floating_dtype(mean, op, "mean"), eps, momentum});
      if (stats.defined() && !in_kernel) {
        running_mean->lerp_(mean.to(running_mean->scalar_type()), momentum);
        running_var->lerp_(var.to(running_var->scalar_type()), momentum);
      }
    });
    return {normalize<Device>(op, x, z, nullptr, mean, inv_std, weight, bias, fuse_relu, order), mean, var, inv_std};
  }

  static void save(AutogradContext& ctx, const Tensor& input, const OptionalTensor& z, const OptionalTensor& weight,
                   const OptionalTensor& bias, const OptionalTensor& /*running_mean*/,
                   const OptionalTensor& /*running_var*/, double /*momentum*/, double /*eps*/, bool channels_last,
                   bool permuted, bool fuse_relu, const std::tuple<Tensor, Tensor, Tensor, Tensor>& outputs) {
    const auto& [output, mean, var, inv_std] = outputs;
    save_step(ctx, input, z, weight, bias, mean, inv_std, /*batch_statistics=*/true, channels_last, permuted,
              fuse_relu);
    ctx.mark_non_differentiable({mean, var, inv_std});
  }

  static Grads backward(AutogradContext& ctx, Grads grads) { return step_grads(ctx, grads); }

 private:
  // A running statistic ([C] floating, on the input's device) in the statistics dtype, contiguous:
  // itself when it already is; undefined when not given.
  static Tensor running_statistics(const char* op, const OptionalTensor& running, const Tensor& x,
                                   const c10::SymInt& channels) {
    return defined(running) ? channel_vector(op, "running statistics", *running, x, channels) : Tensor();
  }
};

}  // namespace

APEX_LIBRARY(m) {
  define_differentiable<BatchNormTrain>(m);
  define_first_output<BatchNormTrain>(m);  // the eager Python calls
}

}  // namespace apex::syncbn
