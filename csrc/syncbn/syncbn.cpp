// syncbn: the SyncBatchNorm op functions of apex.parallel.SyncBatchNorm's autograd.Function (whose
// collectives run between them), each declared once (schema, argument checks, outputs); apex/op.h
// turns them into torch.ops.apex.syncbn_* ops with CPU, CUDA and Meta (shape) kernels. They are never
// differentiated themselves: registered Autograd::kNever, they cost no autograd work.
//
// One process's step (no collective) is one differentiable op instead, and one backward op, each in a
// unit of its own (step.h): the registrations of this op are split so that a build compiles them side
// by side (benchmarks/build/NOTES.md, session 31).
#include <ATen/ops/empty.h>

#include <tuple>

#include "op_functions.h"

namespace apex::syncbn {
namespace {

// Element counts per rank, [world] int64.
Tensor counts_of(const char* op, const Tensor& count, const Tensor& like) {
  check_same_device(count, like, op, "count", "input");
  const auto wrong_shape = [&] {
    return message(op, ": count must be a non-empty 1-D tensor (one entry per rank), got shape ", count.sym_sizes());
  };
  APEX_CHECK(count.dim() == 1, wrong_shape());
  APEX_CHECK(count.sym_numel().sym_gt(0), wrong_shape());
  return count.to(at::kLong).contiguous();
}

// {sum(dy), sum(dy * (x - mean)), grad_weight, grad_bias} per channel; without a weight, grad_weight
// and grad_bias are empty (as in NVIDIA apex), else in the weight's dtype.
template <class Device>
std::tuple<Tensor, Tensor, Tensor, Tensor> grad_sums(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                                     const Tensor& inv_std, const OptionalTensor& weight,
                                                     bool channels_last) {
  const char* op = channels_last ? "syncbn_reduce_bn_c_last" : "syncbn_reduce_bn";
  const KernelOrder order{channels_last};
  const c10::SymInt channels = channels_of(op, x, order);
  const Tensor input = in_kernel_order(x, order);
  const Tensor grad_output = like_input(op, "grad_output", dy, x, order);
  const Tensor m = channel_vector(op, "mean", mean, x, channels);
  const Tensor s = channel_vector(op, "inv_std", inv_std, x, channels);
  if (defined(weight)) channel_vector(op, "weight", *weight, x, channels);  // checked; only its dtype is used
  auto [sum_dy, sum_dy_xmu, grad_weight] =
      gradient_sums_of<Device>(op, grad_output, input, m, s, /*weight_grad=*/defined(weight), order);
  if (!defined(weight)) return {sum_dy, sum_dy_xmu, at::empty({0}, m.options()), at::empty({0}, m.options())};
  const auto weight_dtype = weight->scalar_type();
  return {sum_dy, sum_dy_xmu, in_dtype(grad_weight, weight_dtype), in_dtype(sum_dy, weight_dtype)};
}

template <class Device>
Tensor input_grad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& inv_std,
                  const OptionalTensor& weight, const Tensor& sum_dy, const Tensor& sum_dy_xmu, const Tensor& count,
                  bool channels_last) {
  const char* op = channels_last ? "syncbn_batchnorm_backward_c_last" : "syncbn_batchnorm_backward";
  const KernelOrder order{channels_last};
  const c10::SymInt channels = channels_of(op, x, order);
  return input_grad_of<Device>(op, like_input(op, "grad_output", dy, x, order), in_kernel_order(x, order),
                               channel_vector(op, "mean", mean, x, channels),
                               channel_vector(op, "inv_std", inv_std, x, channels),
                               optional_channel_vector(op, "weight", weight, x, channels),
                               channel_vector(op, "sum_dy", sum_dy, x, channels),
                               channel_vector(op, "sum_dy_xmu", sum_dy_xmu, x, channels), counts_of(op, count, x),
                               /*elements: unused with counts*/ 0, order);
}

// ---- the ops -----------------------------------------------------------------------------------

// The NCHW op, or with kChannelsLast its twin for (..., C) inputs ("_c_last"): one struct serves both.
// Per-channel mean and biased variance: float32 (float64 for float64 input).
template <bool kChannelsLast>
struct WelfordMeanVar {
  static constexpr const char* kSchema =
      kChannelsLast ? "syncbn_welford_mean_var_c_last(Tensor input) -> (Tensor mean, Tensor var_biased)"
                    : "syncbn_welford_mean_var(Tensor input) -> (Tensor mean, Tensor var_biased)";
  template <class Device>
  static std::tuple<Tensor, Tensor> call(const Tensor& input) {
    return mean_var<Device>(input, KernelOrder{kChannelsLast});
  }
};

// Merges per-rank statistics ([world, C] means and biased variances, [world] counts) into the global
// mean, unbiased variance and 1 / sqrt(biased variance + eps): exact for any mix of batch sizes.
struct WelfordParallel {
  static constexpr const char* kSchema =
      "syncbn_welford_parallel(Tensor mean, Tensor var_biased, Tensor count, float eps) "
      "-> (Tensor mean, Tensor var, Tensor inv_std)";

  template <class Device>
  static std::tuple<Tensor, Tensor, Tensor> call(const Tensor& mean, const Tensor& var_biased, const Tensor& count,
                                                 double eps) {
    const char* op = "syncbn_welford_parallel";
    const auto wrong_shape = [&] { return message(op, ": mean must have shape [world_size, channels], got ", mean.sym_sizes()); };
    APEX_CHECK(mean.dim() == 2, wrong_shape());
    APEX_CHECK(mean.sym_size(0).sym_gt(0), wrong_shape());
    APEX_CHECK(mean.sym_size(1).sym_gt(0), wrong_shape());
    APEX_CHECK(at::isFloatingType(mean.scalar_type()), op, ": mean must be floating point, got ", mean.scalar_type());
    APEX_CHECK(var_biased.sym_sizes().equals(mean.sym_sizes()), op, ": var_biased must have the shape of mean ",
               mean.sym_sizes(), ", got ", var_biased.sym_sizes());
    APEX_CHECK(count.dim() == 1, op, ": count must have shape [", mean.sym_size(0), "], got ", count.sym_sizes());
    APEX_CHECK(count.sym_size(0).sym_eq(mean.sym_size(0)), op, ": count must have shape [", mean.sym_size(0), "], got ",
               count.sym_sizes());
    APEX_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
    check_same_device(var_biased, mean, op, "var_biased", "mean");
    check_same_device(count, mean, op, "count", "mean");
    const at::ScalarType statistics = statistics_dtype(mean.scalar_type());
    const Tensor means = mean.to(statistics).contiguous(), vars = var_biased.to(statistics).contiguous();
    const Tensor counts = count.to(at::kLong).contiguous();
    Tensor out_mean = at::empty_symint({mean.sym_size(1)}, means.options());
    Tensor out_var = at::empty_like(out_mean), inv_std = at::empty_like(out_mean);
    launch<Device>(means, [&](const auto& device) {
      welford_parallel(device, MergeArgs{means.const_data_ptr(), vars.const_data_ptr(), counts.const_data_ptr<int64_t>(),
                                         /*elements: unused with counts*/ 0, out_mean.mutable_data_ptr(),
                                         out_var.mutable_data_ptr(), inv_std.mutable_data_ptr(),
                                         /*running_mean*/ nullptr, /*running_var*/ nullptr, means.size(0),
                                         means.size(1), statistics == at::kDouble ? Dtype::kFloat64 : Dtype::kFloat32,
                                         eps, /*momentum*/ 0});
    });
    return {out_mean, out_var, inv_std};
  }
};

// (input - mean) * inv_std * weight + shift, for an (N, C, ...) input.
struct BatchnormForward {
  static constexpr const char* kSchema =
      "syncbn_batchnorm_forward(Tensor input, Tensor mean, Tensor inv_std, Tensor? weight, Tensor? shift) -> Tensor";
  template <class Device>
  static Tensor call(const Tensor& input, const Tensor& mean, const Tensor& inv_std, const OptionalTensor& weight,
                     const OptionalTensor& shift) {
    return normalize<Device>("syncbn_batchnorm_forward", input, std::nullopt, nullptr, mean, inv_std, weight, shift,
                             false, KernelOrder{/*channels_last=*/false});
  }
};

// The same for a (..., C) input, then + z and relu (when asked).
struct BatchnormForwardChannelsLast {
  static constexpr const char* kSchema =
      "syncbn_batchnorm_forward_c_last(Tensor input, Tensor? z, Tensor mean, Tensor inv_std, Tensor? weight, "
      "Tensor? shift, bool fuse_relu) -> Tensor";
  template <class Device>
  static Tensor call(const Tensor& input, const OptionalTensor& z, const Tensor& mean, const Tensor& inv_std,
                     const OptionalTensor& weight, const OptionalTensor& shift, bool fuse_relu) {
    return normalize<Device>("syncbn_batchnorm_forward_c_last", input, z, nullptr, mean, inv_std, weight, shift,
                             fuse_relu, KernelOrder{/*channels_last=*/true});
  }
};

// Per-channel sum(dy) and sum(dy * (x - mean)), and the parameter grads they give (NCHW or "_c_last").
template <bool kChannelsLast>
struct ReduceBn {
  static constexpr const char* kSchema =
      kChannelsLast
          ? "syncbn_reduce_bn_c_last(Tensor grad_output, Tensor input, Tensor mean, Tensor inv_std, Tensor? weight) "
            "-> (Tensor sum_dy, Tensor sum_dy_xmu, Tensor grad_weight, Tensor grad_bias)"
          : "syncbn_reduce_bn(Tensor grad_output, Tensor input, Tensor mean, Tensor inv_std, Tensor? weight) "
            "-> (Tensor sum_dy, Tensor sum_dy_xmu, Tensor grad_weight, Tensor grad_bias)";
  template <class Device>
  static std::tuple<Tensor, Tensor, Tensor, Tensor> call(const Tensor& grad_output, const Tensor& input,
                                                         const Tensor& mean, const Tensor& inv_std,
                                                         const OptionalTensor& weight) {
    return grad_sums<Device>(grad_output, input, mean, inv_std, weight, kChannelsLast);
  }
};

// grad_input from the (all-reduced) sums; count: elements per channel on each rank (NCHW or "_c_last").
template <bool kChannelsLast>
struct BatchnormBackward {
  static constexpr const char* kSchema =
      kChannelsLast
          ? "syncbn_batchnorm_backward_c_last(Tensor grad_output, Tensor input, Tensor mean, Tensor inv_std, "
            "Tensor? weight, Tensor sum_dy, Tensor sum_dy_xmu, Tensor count) -> Tensor"
          : "syncbn_batchnorm_backward(Tensor grad_output, Tensor input, Tensor mean, Tensor inv_std, "
            "Tensor? weight, Tensor sum_dy, Tensor sum_dy_xmu, Tensor count) -> Tensor";
  template <class Device>
  static Tensor call(const Tensor& grad_output, const Tensor& input, const Tensor& mean, const Tensor& inv_std,
                     const OptionalTensor& weight, const Tensor& sum_dy, const Tensor& sum_dy_xmu,
                     const Tensor& count) {
    return input_grad<Device>(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count, kChannelsLast);
  }
};

// grad_output with zeros where the fused forward's relu clipped (channels-last only). The forward
// output is recomputed from x (and z), not kept: a read instead of a whole activation held for backward.
struct ReluBackwardChannelsLast {
  static constexpr const char* kSchema =
      "syncbn_relu_bw_c_last(Tensor grad_output, Tensor input, Tensor? z, Tensor mean, Tensor inv_std, "
      "Tensor? weight, Tensor? shift) -> Tensor";
  template <class Device>
  static Tensor call(const Tensor& grad_output, const Tensor& input, const OptionalTensor& z, const Tensor& mean,
                     const Tensor& inv_std, const OptionalTensor& weight, const OptionalTensor& shift) {
    return normalize<Device>("syncbn_relu_bw_c_last", input, z, &grad_output, mean, inv_std, weight, shift,
                             /*fuse_relu=*/true, KernelOrder{/*channels_last=*/true});
  }
};

}  // namespace

APEX_LIBRARY(m) {
  define<WelfordMeanVar<false>>(m, Autograd::kNever);
  define<WelfordMeanVar<true>>(m, Autograd::kNever);
  define<WelfordParallel>(m, Autograd::kNever);
  define<BatchnormForward>(m, Autograd::kNever);
  define<BatchnormForwardChannelsLast>(m, Autograd::kNever);
  define<ReduceBn<false>>(m, Autograd::kNever);
  define<ReduceBn<true>>(m, Autograd::kNever);
  define<BatchnormBackward<false>>(m, Autograd::kNever);
  define<BatchnormBackward<true>>(m, Autograd::kNever);
  define<ReluBackwardChannelsLast>(m, Autograd::kNever);
}

}  // namespace apex::syncbn
