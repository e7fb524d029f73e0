// syncbn: the SyncBatchNorm op functions, each declared once (schema, argument checks, outputs);
// apex/op.h turns them into torch.ops.apex.syncbn_* ops with CPU, CUDA and Meta (shape) kernels.
//
// They are kernels of apex.parallel.SyncBatchNorm's autograd.Function (whose collectives run between
// them), never differentiated themselves: registered Autograd::kNever, they cost no autograd work.
// One process's training step (no collective) is one differentiable op instead, syncbn_batch_norm:
// the same kernels, with its formula in C++, so that it costs the host what torch's BatchNorm does.
// Each op checks its arguments, brings them into the form the kernels assume (contiguous,
// per-channel vectors in the statistics dtype), allocates outputs and runs one device's kernel.
#include <ATen/ops/full.h>
#include <ATen/ops/mul.h>

#include <optional>
#include <tuple>
#include <type_traits>

#include "apex/autograd.h"
#include "apex/torch_scratch.h"
#include "syncbn.h"

namespace apex::syncbn {
namespace {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

bool defined(const OptionalTensor& t) { return t.has_value() && t->defined(); }

// Channels of `input` (dim 1, or the last with channels_last), after checking its rank and dtype.
c10::SymInt channels_of(const char* op, const Tensor& input, bool channels_last) {
  APEX_CHECK(input.dim() >= 2, op, ": input must have at least 2 dimensions (batch, channel, ...), got shape ",
             input.sym_sizes());
  floating_dtype(input, op, "input");
  c10::SymInt channels = channels_last ? input.sym_size(-1) : input.sym_size(1);
  APEX_CHECK(channels.sym_gt(0), op, ": input has no channels (shape ", input.sym_sizes(), ")");
  return channels;
}

// The (outer, channels, inner) view of a real (non-symbolic) input.
Layout layout_of(const Tensor& input, bool channels_last) {
  const int64_t channels = channels_last ? input.size(-1) : input.size(1);
  if (channels_last) return {input.numel() / channels, channels, 1};
  int64_t inner = 1;
  for (int64_t d = 2; d < input.dim(); ++d) inner *= input.size(d);
  return {input.size(0), channels, inner};
}

// A per-channel vector (mean, inv_std, weight, ...): [C], floating point, on input's device; returned
// contiguous in the statistics dtype, as the kernels read it.
Tensor channel_vector(const char* op, const char* name, const Tensor& t, const Tensor& input,
                      const c10::SymInt& channels) {
  check_same_device(t, input, op, name, "input");
  const auto wrong_shape = [&] { return message(op, ": ", name, " must have shape [", channels, "], got ", t.sym_sizes()); };
  APEX_CHECK(t.dim() == 1, wrong_shape());
  APEX_CHECK(t.sym_size(0).sym_eq(channels), wrong_shape());
  APEX_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be floating point, got ", t.scalar_type());
  return t.to(statistics_dtype(input.scalar_type())).contiguous();
}

Tensor optional_channel_vector(const char* op, const char* name, const OptionalTensor& t, const Tensor& input,
                               const c10::SymInt& channels) {
  return defined(t) ? channel_vector(op, name, *t, input, channels) : Tensor();
}

// A tensor that pairs element-wise with input (grad_output, z).
Tensor like_input(const char* op, const char* name, const Tensor& t, const Tensor& input) {
  check_same_device(t, input, op, name, "input");
  APEX_CHECK(t.sym_sizes().equals(input.sym_sizes()), op, ": ", name, " must have the shape of input ",
             input.sym_sizes(), ", got ", t.sym_sizes());
  APEX_CHECK(t.scalar_type() == input.scalar_type(), op, ": ", name, " must have the dtype of input (",
             input.scalar_type(), "), got ", t.scalar_type());
  return t.contiguous();
}

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

const void* data_or_null(const Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

// Per-channel results of no elements are zeros: false, with both outputs zeroed, for an empty input.
bool has_elements(const Tensor& input, const Tensor& first, const Tensor& second) {
  if (input.numel() > 0) return true;
  first.zero_();
  second.zero_();
  return false;
}

// Runs a reduction kernel: on CUDA it asks for scratch (its per-slice partial states).
template <class Device, class Args, class Kernel>
void run_reduction(const Device& device, const Args& args, const Tensor& like, Kernel&& kernel) {
  if constexpr (std::is_same_v<Device, Cpu>) {
    kernel(device, args);
  } else {
    Tensor scratch;
    kernel(device, args, torch_scratch(like, scratch));
  }
}

// ---- the op functions, shared by the NCHW and channels-last ops -------------------------------

// Per-channel mean and biased variance of one process's input (zeros for an empty input).
template <class Device>
std::tuple<Tensor, Tensor> mean_var(const Tensor& x, bool channels_last) {
  const char* op = channels_last ? "syncbn_welford_mean_var_c_last" : "syncbn_welford_mean_var";
  const c10::SymInt channels = channels_of(op, x, channels_last);
  const Tensor input = x.contiguous();
  const auto statistics = x.options().dtype(statistics_dtype(x.scalar_type()));
  Tensor mean = at::empty_symint({channels}, statistics), var_biased = at::empty_symint({channels}, statistics);
  launch<Device>(input, [&](const auto& device) {
    if (!has_elements(input, mean, var_biased)) return;
    const StatisticsArgs args{input.const_data_ptr(), mean.mutable_data_ptr(), var_biased.mutable_data_ptr(),
                              layout_of(input, channels_last), floating_dtype(input, op, "input")};
    run_reduction(device, args, input, [](const auto&... a) { welford_mean_var(a...); });
  });
  return {mean, var_biased};
}

// y = (x - mean) * inv_std * weight + shift [+ z] [relu] (batchnorm_forward); given `grad_output`, that
// relu's backward instead: grad_output where the recomputed y is positive (relu_backward). z, the relu
// and its backward are channels-last only.
template <class Device>
Tensor normalize(const char* op, const Tensor& x, const OptionalTensor& z, const Tensor* grad_output,
                 const Tensor& mean, const Tensor& inv_std, const OptionalTensor& weight, const OptionalTensor& shift,
                 bool fuse_relu, bool channels_last) {
  const c10::SymInt channels = channels_of(op, x, channels_last);
  const Tensor input = x.contiguous();
  const Tensor dy = grad_output ? like_input(op, "grad_output", *grad_output, x) : Tensor();
  const Tensor m = channel_vector(op, "mean", mean, x, channels);
  const Tensor s = channel_vector(op, "inv_std", inv_std, x, channels);
  const Tensor w = optional_channel_vector(op, "weight", weight, x, channels);
  const Tensor b = optional_channel_vector(op, "shift", shift, x, channels);
  const Tensor residual = defined(z) ? like_input(op, "z", *z, x) : Tensor();
  Tensor out = at::empty_symint(x.sym_sizes(), x.options());
  launch<Device>(input, [&](const auto& device) {
    if (input.numel() == 0) return;
    const NormalizeArgs args{input.const_data_ptr(), data_or_null(residual), data_or_null(dy), m.const_data_ptr(),
                             s.const_data_ptr(), data_or_null(w), data_or_null(b), out.mutable_data_ptr(),
                             layout_of(input, channels_last), floating_dtype(input, op, "input"), fuse_relu};
    if (dy.defined()) {
      relu_backward(device, args);
    } else {
      batchnorm_forward(device, args);
    }
  });
  return out;
}

// {sum(dy), sum(dy * (x - mean)), grad_weight, grad_bias} per channel; without a weight, grad_weight
// and grad_bias are empty (as in NVIDIA apex), else in the weight's dtype.
template <class Device>
std::tuple<Tensor, Tensor, Tensor, Tensor> grad_sums(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                                     const Tensor& inv_std, const OptionalTensor& weight,
                                                     bool channels_last) {
  const char* op = channels_last ? "syncbn_reduce_bn_c_last" : "syncbn_reduce_bn";
  const c10::SymInt channels = channels_of(op, x, channels_last);
  const Tensor input = x.contiguous();
  const Tensor grad_output = like_input(op, "grad_output", dy, x);
  const Tensor m = channel_vector(op, "mean", mean, x, channels);
  const Tensor s = channel_vector(op, "inv_std", inv_std, x, channels);
  if (defined(weight)) channel_vector(op, "weight", *weight, x, channels);  // checked; only its dtype is used
  Tensor sum_dy = at::empty_symint({channels}, m.options()), sum_dy_xmu = at::empty_symint({channels}, m.options());
  launch<Device>(input, [&](const auto& device) {
    if (!has_elements(input, sum_dy, sum_dy_xmu)) return;
    const GradSumsArgs args{grad_output.const_data_ptr(), input.const_data_ptr(), m.const_data_ptr(),
                            sum_dy.mutable_data_ptr(), sum_dy_xmu.mutable_data_ptr(), layout_of(input, channels_last),
                            floating_dtype(input, op, "input")};
    run_reduction(device, args, input, [](const auto&... a) { reduce_bn(a...); });
  });
  if (!defined(weight)) return {sum_dy, sum_dy_xmu, at::empty({0}, m.options()), at::empty({0}, m.options())};
  const auto weight_dtype = weight->scalar_type();
  return {sum_dy, sum_dy_xmu, at::mul(sum_dy_xmu, s).to(weight_dtype), sum_dy.to(weight_dtype)};
}

template <class Device>
Tensor input_grad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& inv_std,
                  const OptionalTensor& weight, const Tensor& sum_dy, const Tensor& sum_dy_xmu, const Tensor& count,
                  bool channels_last) {
  const char* op = channels_last ? "syncbn_batchnorm_backward_c_last" : "syncbn_batchnorm_backward";
  const c10::SymInt channels = channels_of(op, x, channels_last);
  const Tensor input = x.contiguous();
  const Tensor grad_output = like_input(op, "grad_output", dy, x);
  const Tensor m = channel_vector(op, "mean", mean, x, channels);
  const Tensor s = channel_vector(op, "inv_std", inv_std, x, channels);
  const Tensor w = optional_channel_vector(op, "weight", weight, x, channels);
  const Tensor sums = channel_vector(op, "sum_dy", sum_dy, x, channels);
  const Tensor sums_xmu = channel_vector(op, "sum_dy_xmu", sum_dy_xmu, x, channels);
  const Tensor counts = counts_of(op, count, x);
  Tensor grad_input = at::empty_symint(x.sym_sizes(), x.options());
  launch<Device>(input, [&](const auto& device) {
    if (input.numel() == 0) return;
    batchnorm_backward(device, InputGradArgs{grad_output.const_data_ptr(), input.const_data_ptr(), m.const_data_ptr(),
                                             s.const_data_ptr(), data_or_null(w), sums.const_data_ptr(),
                                             sums_xmu.const_data_ptr(), counts.const_data_ptr<int64_t>(),
                                             counts.numel(), grad_input.mutable_data_ptr(),
                                             layout_of(input, channels_last), floating_dtype(input, op, "input")});
  });
  return grad_input;
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
    return mean_var<Device>(input, kChannelsLast);
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
                                         out_mean.mutable_data_ptr(), out_var.mutable_data_ptr(),
                                         inv_std.mutable_data_ptr(), means.size(0), means.size(1),
                                         statistics == at::kDouble ? Dtype::kFloat64 : Dtype::kFloat32, eps});
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
                             false, /*channels_last=*/false);
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
                             fuse_relu, /*channels_last=*/true);
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
                             /*fuse_relu=*/true, /*channels_last=*/true);
  }
};

// ---- one process's training step -----------------------------------------------------------

// (N, C, *spatial) stored channels_last <-> its (N, *spatial, C) view, which the channels-last
// kernels read without a copy.
Tensor to_channels_innermost(const Tensor& t) {
  std::vector<int64_t> order{0};
  for (int64_t d = 2; d < t.dim(); ++d) order.push_back(d);
  order.push_back(1);
  return t.permute(order);
}
Tensor from_channels_innermost(const Tensor& t) {
  std::vector<int64_t> order{0, t.dim() - 1};
  for (int64_t d = 1; d < t.dim() - 1; ++d) order.push_back(d);
  return t.permute(order);
}

// A parameter as the kernels read it: in the statistics dtype of `input`.
Tensor accumulate(const OptionalTensor& p, const Tensor& input) {
  return defined(p) ? p->to(statistics_dtype(input.scalar_type())) : Tensor();
}

// Elements per channel of a one-process batch, as the [world] counts the merge and the backward
// kernel take.
Tensor count_of(const Tensor& input, bool channels_last) {
  const c10::SymInt channels = channels_last ? input.sym_size(-1) : input.sym_size(1);
  return at::full_symint({1}, c10::Scalar(input.sym_numel() / channels), input.options().dtype(at::kLong));
}

// Batch norm of one process's batch with its own statistics, + z and relu when asked (channels
// innermost only): (output, mean, unbiased var, 1 / sqrt(biased var + eps)), the statistics per
// channel in the statistics dtype (mean and var are what the caller folds into its running
// statistics). channels_last: input is (*, C); permuted:
// input is (N, C, *) stored channels_last, and so is the output. Differentiable in input, z, weight
// and bias.
struct BatchNormTrain {
  static constexpr const char* kSchema =
      "syncbn_batch_norm(Tensor input, Tensor? z, Tensor? weight, Tensor? bias, float eps, bool channels_last, "
      "bool permuted, bool fuse_relu) -> (Tensor output, Tensor mean, Tensor var, Tensor inv_std)";

  template <class Device>
  static std::tuple<Tensor, Tensor, Tensor, Tensor> call(const Tensor& input, const OptionalTensor& z,
                                                         const OptionalTensor& weight, const OptionalTensor& bias,
                                                         double eps, bool channels_last, bool permuted,
                                                         bool fuse_relu) {
    const char* op = "syncbn_batch_norm";
    APEX_CHECK(!permuted || channels_last, op, ": permuted inputs are read channels-last");
    APEX_CHECK(channels_last || (!defined(z) && !fuse_relu), op, ": z and fuse_relu need channels_last");
    const Tensor x = permuted ? to_channels_innermost(input) : input;
    const OptionalTensor residual = defined(z) ? OptionalTensor(permuted ? to_channels_innermost(*z) : *z) : std::nullopt;
    auto [local_mean, local_var] = mean_var<Device>(x, channels_last);
    auto [mean, var, inv_std] = WelfordParallel::call<Device>(local_mean.unsqueeze(0), local_var.unsqueeze(0),
                                                              count_of(x, channels_last), eps);
    const Tensor w = accumulate(weight, x), b = accumulate(bias, x);
    Tensor out = channels_last ? normalize<Device>(op, x, residual, nullptr, mean, inv_std, w, b, fuse_relu, true)
                               : normalize<Device>(op, x, std::nullopt, nullptr, mean, inv_std, w, b, false, false);
    return {permuted ? from_channels_innermost(out) : out, mean, var, inv_std};
  }

  static void save(AutogradContext& ctx, const Tensor& input, const OptionalTensor& z, const OptionalTensor& weight,
                   const OptionalTensor& bias, double eps, bool channels_last, bool permuted, bool fuse_relu,
                   const std::tuple<Tensor, Tensor, Tensor, Tensor>& outputs) {
    const auto& [output, mean, var, inv_std] = outputs;
    const Tensor x = (permuted ? to_channels_innermost(input) : input).contiguous();
    Tensor residual;
    if (defined(z)) residual = (permuted ? to_channels_innermost(*z) : *z).contiguous();
    ctx.save_for_backward({x, weight.value_or(Tensor()), accumulate(weight, x), mean, inv_std, residual,
                           fuse_relu ? accumulate(bias, x) : Tensor()});
    ctx.saved_data["channels_last"] = channels_last;
    ctx.saved_data["permuted"] = permuted;
    ctx.saved_data["fuse_relu"] = fuse_relu;
    ctx.mark_non_differentiable({mean, var, inv_std});
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[0].defined()) return {};
    const Grads saved = ctx.get_saved_variables();
    const Tensor &x = saved[0], &weight = saved[1], &weight_acc = saved[2], &mean = saved[3], &inv_std = saved[4],
                 &z = saved[5], &bias_acc = saved[6];
    const bool channels_last = ctx.saved_data["channels_last"].toBool();
    const bool permuted = ctx.saved_data["permuted"].toBool();
    const auto optional = [](const Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; };
    Tensor dy = (permuted ? to_channels_innermost(grads[0]) : grads[0]).contiguous();
    if (ctx.saved_data["fuse_relu"].toBool()) {
      dy = call_op<ReluBackwardChannelsLast>(dy, x, optional(z), mean, inv_std, optional(weight_acc), optional(bias_acc));
    }
    Tensor grad_z;
    if (z.defined() && ctx.needs_input_grad(1)) grad_z = permuted ? from_channels_innermost(dy.clone()) : dy.clone();
    auto [sum_dy, sum_dy_xmu, grad_weight, grad_bias] =
        channels_last ? call_op<ReduceBn<true>>(dy, x, mean, inv_std, optional(weight))
                      : call_op<ReduceBn<false>>(dy, x, mean, inv_std, optional(weight));
    Tensor grad_input;
    if (ctx.needs_input_grad(0)) {
      const Tensor count = count_of(x, channels_last);
      grad_input = channels_last ? call_op<BatchnormBackward<true>>(dy, x, mean, inv_std, optional(weight_acc), sum_dy,
                                                                    sum_dy_xmu, count)
                                 : call_op<BatchnormBackward<false>>(dy, x, mean, inv_std, optional(weight_acc), sum_dy,
                                                                     sum_dy_xmu, count);
      if (permuted) grad_input = from_channels_innermost(grad_input);
    }
    if (!weight.defined()) grad_weight = grad_bias = Tensor();
    return {grad_input, grad_z, grad_weight, grad_bias};
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
  define_differentiable<BatchNormTrain>(m);
}

}  // namespace apex::syncbn
