// syncbn: the SyncBatchNorm op functions, each declared once (schema, argument checks, outputs);
// apex/op.h turns them into torch.ops.apex.syncbn_* ops with CPU, CUDA and Meta (shape) kernels.
//
// They are kernels of apex.parallel.SyncBatchNorm's autograd.Function (whose collectives run between
// them), never differentiated themselves: registered Autograd::kNever, they cost no autograd work.
// One process's step (no collective) is one differentiable op instead, syncbn_batch_norm (training)
// or syncbn_batch_norm_eval, and one backward op: the same kernels, with the formula in C++, so that
// it costs the host what torch's BatchNorm does.
// Each op checks its arguments, brings them into the form the kernels assume (contiguous, or stored
// channels-innermost: KernelOrder; per-channel vectors in the statistics dtype), allocates outputs
// and runs one device's kernel.
#include <ATen/ops/empty.h>
#include <ATen/ops/lerp.h>

#include <array>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "apex/autograd.h"
#include "apex/torch_scratch.h"
#include "syncbn.h"

namespace apex::syncbn {
namespace {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

bool defined(const OptionalTensor& t) { return t.has_value() && t->defined(); }

// Where a tensor's channels are and how the kernels walk its memory.
struct KernelOrder {
  bool channels_last;  // rows of C channels ((*, C) memory), else (N, C, *) planes
  // An (N, C, *) tensor walked as rows of channels: its storage is channels-innermost (channels_last
  // memory format), its shape keeps C at dim 1. One process's step only; implies channels_last.
  bool permuted = false;

  int64_t channel_dim() const { return channels_last && !permuted ? -1 : 1; }
};

// Channels of `input` after checking its rank and dtype.
c10::SymInt channels_of(const char* op, const Tensor& input, KernelOrder order) {
  APEX_CHECK(input.dim() >= 2, op, ": input must have at least 2 dimensions (batch, channel, ...), got shape ",
             input.sym_sizes());
  floating_dtype(input, op, "input");
  c10::SymInt channels = input.sym_size(order.channel_dim());
  APEX_CHECK(channels.sym_gt(0), op, ": input has no channels (shape ", input.sym_sizes(), ")");
  return channels;
}

// The (outer, channels, inner) view of a real (non-symbolic) input stored in `order`.
Layout layout_of(const Tensor& input, KernelOrder order) {
  const int64_t channels = input.size(order.channel_dim());
  if (order.channels_last) return {input.numel() / channels, channels, 1};
  int64_t inner = 1;
  for (int64_t d = 2; d < input.dim(); ++d) inner *= input.size(d);
  return {input.size(0), channels, inner};
}

// (N, C, *spatial) <-> its (N, *spatial, C) view: for permuted tensors of a rank without a
// channels-innermost memory format (below), whose kernel memory is that view's.
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

// The memory format that stores an (N, C, *spatial) tensor channels-innermost, where torch has one.
std::optional<at::MemoryFormat> channels_innermost_format(const Tensor& t) {
  if (t.dim() == 4) return at::MemoryFormat::ChannelsLast;
  if (t.dim() == 5) return at::MemoryFormat::ChannelsLast3d;
  return std::nullopt;
}

// `t` (of the caller's shape) with its memory in `order`: itself when it already is (no view or
// copy dispatched: the common case), else a copy.
Tensor in_kernel_order(const Tensor& t, KernelOrder order) {
  if (!order.permuted) return t.contiguous();
  if (const auto format = channels_innermost_format(t)) return t.contiguous(*format);
  return from_channels_innermost(to_channels_innermost(t).contiguous());
}

// An uninitialized tensor of `like`'s shape, dtype and device, stored in `order`.
Tensor empty_in_kernel_order(const Tensor& like, KernelOrder order) {
  if (!order.permuted) return at::empty_symint(like.sym_sizes(), like.options());
  if (const auto format = channels_innermost_format(like)) {
    return at::empty_symint(like.sym_sizes(), like.options(), *format);
  }
  return from_channels_innermost(at::empty_symint(to_channels_innermost(like).sym_sizes(), like.options()));
}

// `t` in `dtype`; itself, with no dispatcher call, when it already is.
Tensor in_dtype(const Tensor& t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

// A per-channel vector (mean, inv_std, weight, ...): [C], floating point, on input's device; returned
// contiguous in the statistics dtype, as the kernels read it.
Tensor channel_vector(const char* op, const char* name, const Tensor& t, const Tensor& input,
                      const c10::SymInt& channels) {
  check_same_device(t, input, op, name, "input");
  const auto wrong_shape = [&] { return message(op, ": ", name, " must have shape [", channels, "], got ", t.sym_sizes()); };
  APEX_CHECK(t.dim() == 1, wrong_shape());
  APEX_CHECK(t.sym_size(0).sym_eq(channels), wrong_shape());
  APEX_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be floating point, got ", t.scalar_type());
  return in_dtype(t, statistics_dtype(input.scalar_type())).contiguous();
}

Tensor optional_channel_vector(const char* op, const char* name, const OptionalTensor& t, const Tensor& input,
                               const c10::SymInt& channels) {
  return defined(t) ? channel_vector(op, name, *t, input, channels) : Tensor();
}

// A tensor that pairs element-wise with input (grad_output, z), stored in input's `order`.
Tensor like_input(const char* op, const char* name, const Tensor& t, const Tensor& input, KernelOrder order) {
  check_same_device(t, input, op, name, "input");
  APEX_CHECK(t.sym_sizes().equals(input.sym_sizes()), op, ": ", name, " must have the shape of input ",
             input.sym_sizes(), ", got ", t.sym_sizes());
  APEX_CHECK(t.scalar_type() == input.scalar_type(), op, ": ", name, " must have the dtype of input (",
             input.scalar_type(), "), got ", t.scalar_type());
  return in_kernel_order(t, order);
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
void* mutable_data_or_null(const Tensor& t) { return t.defined() ? t.mutable_data_ptr() : nullptr; }

// Per-channel results of no elements are zeros: false, with the (defined) outputs zeroed, for an empty input.
bool has_elements(const Tensor& input, std::initializer_list<Tensor> outputs) {
  if (input.numel() > 0) return true;
  for (const Tensor& output : outputs) {
    if (output.defined()) output.zero_();
  }
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
std::tuple<Tensor, Tensor> mean_var(const Tensor& x, KernelOrder order) {
  const char* op = order.channels_last ? "syncbn_welford_mean_var_c_last" : "syncbn_welford_mean_var";
  const c10::SymInt channels = channels_of(op, x, order);
  const Tensor input = in_kernel_order(x, order);
  const auto statistics = x.options().dtype(statistics_dtype(x.scalar_type()));
  Tensor mean = at::empty_symint({channels}, statistics), var_biased = at::empty_symint({channels}, statistics);
  launch<Device>(input, [&](const auto& device) {
    if (!has_elements(input, {mean, var_biased})) return;
    const StatisticsArgs args{input.const_data_ptr(), mean.mutable_data_ptr(), var_biased.mutable_data_ptr(),
                              layout_of(input, order), floating_dtype(input, op, "input")};
    run_reduction(device, args, input, [](const auto&... a) { welford_mean_var(a...); });
  });
  return {mean, var_biased};
}

// y = (x - mean) * inv_std * weight + shift [+ z] [relu] (batchnorm_forward), stored as x in `order`;
// given `grad_output`, that relu's backward instead: grad_output where the recomputed y is positive
// (relu_backward). z, the relu and its backward are channels-last only.
template <class Device>
Tensor normalize(const char* op, const Tensor& x, const OptionalTensor& z, const Tensor* grad_output,
                 const Tensor& mean, const Tensor& inv_std, const OptionalTensor& weight, const OptionalTensor& shift,
                 bool fuse_relu, KernelOrder order) {
  const c10::SymInt channels = channels_of(op, x, order);
  const Tensor input = in_kernel_order(x, order);
  const Tensor dy = grad_output ? like_input(op, "grad_output", *grad_output, x, order) : Tensor();
  const Tensor m = channel_vector(op, "mean", mean, x, channels);
  const Tensor s = channel_vector(op, "inv_std", inv_std, x, channels);
  const Tensor w = optional_channel_vector(op, "weight", weight, x, channels);
  const Tensor b = optional_channel_vector(op, "shift", shift, x, channels);
  const Tensor residual = defined(z) ? like_input(op, "z", *z, x, order) : Tensor();
  Tensor out = empty_in_kernel_order(x, order);
  launch<Device>(input, [&](const auto& device) {
    if (input.numel() == 0) return;
    const NormalizeArgs args{input.const_data_ptr(), data_or_null(residual), data_or_null(dy), m.const_data_ptr(),
                             s.const_data_ptr(), data_or_null(w), data_or_null(b), out.mutable_data_ptr(),
                             layout_of(input, order), floating_dtype(input, op, "input"), fuse_relu};
    if (dy.defined()) {
      relu_backward(device, args);
    } else {
      batchnorm_forward(device, args);
    }
  });
  return out;
}

// {sum(dy), sum(dy * (x - mean)), and with `weight_grad` the weight's gradient sum(dy * (x - mean)) *
// inv_std} per channel, in the statistics dtype, of checked operands in `order` (per-channel vectors
// in the statistics dtype).
template <class Device>
std::tuple<Tensor, Tensor, Tensor> gradient_sums_of(const char* op, const Tensor& grad_output, const Tensor& input,
                                                    const Tensor& mean, const Tensor& inv_std, bool weight_grad,
                                                    KernelOrder order) {
  const auto options = mean.options();
  const c10::SymInt channels = mean.sym_size(0);
  Tensor sum_dy = at::empty_symint({channels}, options), sum_dy_xmu = at::empty_symint({channels}, options);
  Tensor grad_weight = weight_grad ? at::empty_symint({channels}, options) : Tensor();
  launch<Device>(input, [&](const auto& device) {
    if (!has_elements(input, {sum_dy, sum_dy_xmu, grad_weight})) return;
    const GradSumsArgs args{grad_output.const_data_ptr(), input.const_data_ptr(), mean.const_data_ptr(),
                            inv_std.const_data_ptr(), sum_dy.mutable_data_ptr(), sum_dy_xmu.mutable_data_ptr(),
                            mutable_data_or_null(grad_weight), layout_of(input, order),
                            floating_dtype(input, op, "input")};
    run_reduction(device, args, input, [](const auto&... a) { reduce_bn(a...); });
  });
  return {sum_dy, sum_dy_xmu, grad_weight};
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

// grad_input of checked operands in `order` (per-channel vectors in the statistics dtype), stored
// in that order. `counts`: [world] elements per channel of each rank, or undefined for one rank of
// `elements`. Without sums (undefined sum_dy and sum_dy_xmu) the statistics were constants (running
// statistics, in eval).
template <class Device>
Tensor input_grad_of(const char* op, const Tensor& grad_output, const Tensor& input, const Tensor& mean,
                     const Tensor& inv_std, const Tensor& weight, const Tensor& sum_dy, const Tensor& sum_dy_xmu,
                     const Tensor& counts, const c10::SymInt& elements, KernelOrder order) {
  Tensor grad_input = empty_in_kernel_order(input, order);
  launch<Device>(input, [&](const auto& device) {
    if (input.numel() == 0) return;
    batchnorm_backward(device, InputGradArgs{grad_output.const_data_ptr(), input.const_data_ptr(),
                                             mean.const_data_ptr(), inv_std.const_data_ptr(), data_or_null(weight),
                                             data_or_null(sum_dy), data_or_null(sum_dy_xmu),
                                             counts.defined() ? counts.const_data_ptr<int64_t>() : nullptr,
                                             elements.expect_int(), counts.defined() ? counts.numel() : 1,
                                             grad_input.mutable_data_ptr(), layout_of(input, order),
                                             floating_dtype(input, op, "input")});
  });
  return grad_input;
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

// ---- one process's step: one differentiable op (training or eval) and one backward op ----------
//
// Without a collective between the kernels, a step of one process needs no autograd.Function: each
// forward is one op whose formula runs in C++, and its backward one op, as torch's BatchNorm, so that
// the host pays what it pays for torch's (one dispatch each way, no count tensor to fill, running
// statistics updated by the kernel that computes the batch statistics).
//
// Layouts: `channels_last` runs the channels-innermost kernels on a (*, C) input; with `permuted`,
// the input (and z) is (N, C, *) stored channels_last, whose memory those kernels read as it is (no
// view, no copy), and the output is (N, C, *) stored channels_last too (KernelOrder). z and fuse_relu
// need channels_last.

void check_step_layout(const char* op, const OptionalTensor& z, bool channels_last, bool permuted, bool fuse_relu) {
  APEX_CHECK(!permuted || channels_last, op, ": permuted inputs are read channels-last");
  APEX_CHECK(channels_last || (!defined(z) && !fuse_relu), op, ": z and fuse_relu need channels_last");
}

// What both forward ops keep for the shared backward (StepBackward): the input and z as given, the
// statistics the output was normalized with, the parameters.
void save_step(AutogradContext& ctx, const Tensor& input, const OptionalTensor& z, const OptionalTensor& weight,
               const OptionalTensor& bias, const Tensor& mean, const Tensor& inv_std, bool batch_statistics,
               bool channels_last, bool permuted, bool fuse_relu) {
  ctx.save_for_backward({input, z.value_or(Tensor()), weight.value_or(Tensor()), bias.value_or(Tensor()), mean,
                         inv_std});
  ctx.saved_data["batch_stats"] = batch_statistics;
  ctx.saved_data["channels_last"] = channels_last;
  ctx.saved_data["permuted"] = permuted;
  ctx.saved_data["fuse_relu"] = fuse_relu;
  ctx.set_materialize_grads(false);
}

Grads step_grads(AutogradContext& ctx, const Grads& grads);

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

// The gradients of either forward op: (grad_input, grad_z, grad_weight, grad_bias), each computed
// only when asked (else empty). Operands and gradients in the forward's layout (see the section's
// comment); grad_weight / grad_bias in weight's dtype, empty without a weight.
struct StepBackward {
  static constexpr const char* kSchema =
      "syncbn_batch_norm_bwd(Tensor grad_output, Tensor input, Tensor? z, Tensor? weight, Tensor? bias, Tensor mean, "
      "Tensor inv_std, bool batch_statistics, bool channels_last, bool permuted, bool fuse_relu, "
      "bool[3] output_mask) -> (Tensor grad_input, Tensor grad_z, Tensor grad_weight, Tensor grad_bias)";

  template <class Device>
  static std::tuple<Tensor, Tensor, Tensor, Tensor> call(const Tensor& grad_output, const Tensor& input,
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
};

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
  define_differentiable<BatchNormEval>(m);
  define_first_output<BatchNormTrain>(m);  // the eager Python calls
  define_first_output<BatchNormEval>(m);
  define<StepBackward>(m);
}

}  // namespace apex::syncbn
