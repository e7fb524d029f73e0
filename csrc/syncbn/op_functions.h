#pragma once
// syncbn: what the op functions share (the SyncBatchNorm ops of syncbn.cpp, one process's step ops of
// step_*.cpp): argument checks, the conversions into the form the kernels assume (contiguous, or stored
// channels-innermost: KernelOrder; per-channel vectors in the statistics dtype), and the op functions
// that allocate outputs and run one device's kernel.
#include <ATen/ops/empty.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "apex/op.h"
#include "apex/torch_scratch.h"
#include "syncbn.h"

namespace apex::syncbn {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

inline bool defined(const OptionalTensor& t) { return t.has_value() && t->defined(); }

// Where a tensor's channels are and how the kernels walk its memory.
struct KernelOrder {
  bool channels_last;  // rows of C channels ((*, C) memory), else (N, C, *) planes
  // An (N, C, *) tensor walked as rows of channels: its storage is channels-innermost (channels_last
  // memory format), its shape keeps C at dim 1. One process's step only; implies channels_last.
  bool permuted = false;

  int64_t channel_dim() const { return channels_last && !permuted ? -1 : 1; }
};

// Channels of `input` after checking its rank and dtype.
inline c10::SymInt channels_of(const char* op, const Tensor& input, KernelOrder order) {
  APEX_CHECK(input.dim() >= 2, op, ": input must have at least 2 dimensions (batch, channel, ...), got shape ",
             input.sym_sizes());
  floating_dtype(input, op, "input");
  c10::SymInt channels = input.sym_size(order.channel_dim());
  APEX_CHECK(channels.sym_gt(0), op, ": input has no channels (shape ", input.sym_sizes(), ")");
  return channels;
}

// The (outer, channels, inner) view of a real (non-symbolic) input stored in `order`.
inline Layout layout_of(const Tensor& input, KernelOrder order) {
  const int64_t channels = input.size(order.channel_dim());
  if (order.channels_last) return {input.numel() / channels, channels, 1};
  int64_t inner = 1;
  for (int64_t d = 2; d < input.dim(); ++d) inner *= input.size(d);
  return {input.size(0), channels, inner};
}

// (N, C, *spatial) <-> its (N, *spatial, C) view: for permuted tensors of a rank without a
// channels-innermost memory format (below), whose kernel memory is that view's.
inline Tensor to_channels_innermost(const Tensor& t) {
  std::vector<int64_t> order{0};
  for (int64_t d = 2; d < t.dim(); ++d) order.push_back(d);
  order.push_back(1);
  return t.permute(order);
}
inline Tensor from_channels_innermost(const Tensor& t) {
  std::vector<int64_t> order{0, t.dim() - 1};
  for (int64_t d = 1; d < t.dim() - 1; ++d) order.push_back(d);
  return t.permute(order);
}

// The memory format that stores an (N, C, *spatial) tensor channels-innermost, where torch has one.
inline std::optional<at::MemoryFormat> channels_innermost_format(const Tensor& t) {
  if (t.dim() == 4) return at::MemoryFormat::ChannelsLast;
  if (t.dim() == 5) return at::MemoryFormat::ChannelsLast3d;
  return std::nullopt;
}

// `t` (of the caller's shape) with its memory in `order`: itself when it already is (no view or
// copy dispatched: the common case), else a copy.
inline Tensor in_kernel_order(const Tensor& t, KernelOrder order) {
  if (!order.permuted) return t.contiguous();
  if (const auto format = channels_innermost_format(t)) return t.contiguous(*format);
  return from_channels_innermost(to_channels_innermost(t).contiguous());
}

// An uninitialized tensor of `like`'s shape, dtype and device, stored in `order`.
inline Tensor empty_in_kernel_order(const Tensor& like, KernelOrder order) {
  if (!order.permuted) return at::empty_symint(like.sym_sizes(), like.options());
  if (const auto format = channels_innermost_format(like)) {
    return at::empty_symint(like.sym_sizes(), like.options(), *format);
  }
  return from_channels_innermost(at::empty_symint(to_channels_innermost(like).sym_sizes(), like.options()));
}

// `t` in `dtype`; itself, with no dispatcher call, when it already is.
inline Tensor in_dtype(const Tensor& t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

// A per-channel vector (mean, inv_std, weight, ...): [C], floating point, on input's device; returned
// contiguous in the statistics dtype, as the kernels read it.
inline Tensor channel_vector(const char* op, const char* name, const Tensor& t, const Tensor& input,
                             const c10::SymInt& channels) {
  check_same_device(t, input, op, name, "input");
  const auto wrong_shape = [&] { return message(op, ": ", name, " must have shape [", channels, "], got ", t.sym_sizes()); };
  APEX_CHECK(t.dim() == 1, wrong_shape());
  APEX_CHECK(t.sym_size(0).sym_eq(channels), wrong_shape());
  APEX_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be floating point, got ", t.scalar_type());
  return in_dtype(t, statistics_dtype(input.scalar_type())).contiguous();
}

inline Tensor optional_channel_vector(const char* op, const char* name, const OptionalTensor& t, const Tensor& input,
                                      const c10::SymInt& channels) {
  return defined(t) ? channel_vector(op, name, *t, input, channels) : Tensor();
}

// A tensor that pairs element-wise with input (grad_output, z), stored in input's `order`.
inline Tensor like_input(const char* op, const char* name, const Tensor& t, const Tensor& input, KernelOrder order) {
  check_same_device(t, input, op, name, "input");
  APEX_CHECK(t.sym_sizes().equals(input.sym_sizes()), op, ": ", name, " must have the shape of input ",
             input.sym_sizes(), ", got ", t.sym_sizes());
  APEX_CHECK(t.scalar_type() == input.scalar_type(), op, ": ", name, " must have the dtype of input (",
             input.scalar_type(), "), got ", t.scalar_type());
  return in_kernel_order(t, order);
}

inline const void* data_or_null(const Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }
inline void* mutable_data_or_null(const Tensor& t) { return t.defined() ? t.mutable_data_ptr() : nullptr; }

// Per-channel results of no elements are zeros: false, with the (defined) outputs zeroed, for an empty input.
inline bool has_elements(const Tensor& input, std::initializer_list<Tensor> outputs) {
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

}  // namespace apex::syncbn
