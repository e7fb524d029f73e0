// The syncbn ops, written once for every device.
//
// Each op checks its arguments, brings them into the form the kernels assume
// (contiguous, statistics and affine parameters in the accumulation dtype),
// allocates outputs and hands the work to a device's kernels (CpuKernels in
// syncbn_cpu.cpp, CudaKernels in the .cu files). Kernels only ever see non-empty
// inputs.
//
// NCHW and channels-last inputs share the kernels through `Layout`: element
// (o, c, i) of an (outer, channels, inner) view lives at (o * channels + c) * inner + i.
// NCHW is (N, C, H*W...); channels-last is (N*H*W..., C, 1).
#pragma once

#include <ATen/ATen.h>
#include <c10/macros/Macros.h>
#include <c10/util/Optional.h>

#include <tuple>

#include "apex/check.h"

namespace apex_syncbn {

using at::Tensor;
using OptTensor = c10::optional<Tensor>;

struct Layout {
  int64_t outer;
  int64_t channels;
  int64_t inner;
  // Also true for NCHW input with one element per plane, which is the same memory.
  C10_HOST_DEVICE bool channels_last() const { return inner == 1; }
};

inline at::ScalarType accumulation_dtype(const Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline Layout layout_of(const Tensor& input, bool channels_last, const char* op) {
  APEX_CHECK(input.dim() >= 2, op, ": input must have at least 2 dimensions (batch, channel, ...), got shape ",
             input.sizes());
  const auto dtype = input.scalar_type();
  APEX_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kDouble, op,
             ": input must be float16, bfloat16, float32 or float64, got ", dtype);
  const int64_t channels = channels_last ? input.size(-1) : input.size(1);
  APEX_CHECK(channels > 0, op, ": input has no channels (shape ", input.sizes(), ")");
  if (channels_last) return {input.numel() / channels, channels, 1};
  int64_t inner = 1;
  for (int64_t d = 2; d < input.dim(); ++d) inner *= input.size(d);
  return {input.size(0), channels, inner};
}

inline void check_same_device(const Tensor& input, const Tensor& other, const char* op, const char* name) {
  APEX_CHECK(other.device() == input.device(), op, ": ", name, " is on ", other.device(), " but input is on ",
             input.device());
}

// Per-channel vectors (mean, inv_std, weight, ...): shape [C], floating point, on input's device.
inline void check_channel_vector(const Tensor& input, const Tensor& t, int64_t channels, const char* op,
                                 const char* name) {
  check_same_device(input, t, op, name);
  APEX_CHECK(t.dim() == 1 && t.size(0) == channels, op, ": ", name, " must have shape [", channels, "], got ",
             t.sizes());
  APEX_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be floating point, got ", t.scalar_type());
}

// A checked per-channel vector in the accumulation dtype, as the kernels read it.
inline Tensor channel_vector(const Tensor& input, const Tensor& t, int64_t channels, const char* op,
                             const char* name) {
  check_channel_vector(input, t, channels, op, name);
  return t.to(accumulation_dtype(input)).contiguous();
}

inline Tensor optional_channel_vector(const Tensor& input, const OptTensor& t, int64_t channels, const char* op,
                                      const char* name) {
  return t.has_value() && t->defined() ? channel_vector(input, *t, channels, op, name) : Tensor();
}

// A tensor that pairs element-wise with input (grad_output, z).
inline Tensor like_input(const Tensor& input, const Tensor& t, const char* op, const char* name) {
  check_same_device(input, t, op, name);
  APEX_CHECK(t.sizes() == input.sizes(), op, ": ", name, " must have the shape of input ", input.sizes(), ", got ",
             t.sizes());
  APEX_CHECK(t.scalar_type() == input.scalar_type(), op, ": ", name, " must have the dtype of input (",
             input.scalar_type(), "), got ", t.scalar_type());
  return t.contiguous();
}

inline Tensor counts_vector(const Tensor& input, const Tensor& count, const char* op) {
  check_same_device(input, count, op, "count");
  APEX_CHECK(count.dim() == 1 && count.numel() > 0, op,
             ": count must be a non-empty 1-D tensor (one entry per rank), got shape ", count.sizes());
  return count.to(at::kLong).contiguous();
}

// What normalizing needs beside the input: y = (x - mean) * inv_std * weight + shift [+ z].
// weight, shift and z may be undefined (1, 0 and 0).
struct NormalizeArgs {
  Tensor mean, inv_std, weight, shift, z;
};

// Checks the statistics, affine parameters and residual of one normalizing op and brings
// them into the kernels' form.
inline NormalizeArgs normalize_args(const Tensor& input, Layout layout, const Tensor& mean, const Tensor& inv_std,
                                    const OptTensor& weight, const OptTensor& shift, const OptTensor& z,
                                    const char* op) {
  return {channel_vector(input, mean, layout.channels, op, "mean"),
          channel_vector(input, inv_std, layout.channels, op, "inv_std"),
          optional_channel_vector(input, weight, layout.channels, op, "weight"),
          optional_channel_vector(input, shift, layout.channels, op, "shift"),
          z.has_value() && z->defined() ? like_input(input, *z, op, "z") : Tensor()};
}

// Statistics of an empty input are zeros; otherwise the kernels write every channel.
inline Tensor channel_output(const Tensor& input, int64_t channels, at::ScalarType dtype) {
  const auto options = input.options().dtype(dtype);
  return input.numel() > 0 ? at::empty({channels}, options) : at::zeros({channels}, options);
}

// The kernels each device provides, declared once; the macro only stamps out one
// struct per device so that CPU and CUDA kernels can live in separate files.
#define APEX_SYNCBN_DECLARE_KERNELS(Name)                                                                         \
  struct Name {                                                                                                   \
    static void welford_mean_var(const Tensor& input, Layout layout, Tensor& mean, Tensor& var_biased);          \
    static void welford_parallel(const Tensor& mean, const Tensor& var_biased, const Tensor& count, double eps, \
                                 Tensor& out_mean, Tensor& out_var, Tensor& inv_std);                             \
    static void batchnorm_forward(const Tensor& input, const NormalizeArgs& args, bool fuse_relu, Layout layout, \
                                  Tensor& out);                                                                   \
    static void relu_backward(const Tensor& grad_output, const Tensor& input, const NormalizeArgs& args,          \
                              Layout layout, Tensor& out);                                                        \
    static void reduce_bn(const Tensor& grad_output, const Tensor& input, const Tensor& mean, Layout layout,      \
                          Tensor& sum_dy, Tensor& sum_dy_xmu);                                                    \
    static void batchnorm_backward(const Tensor& grad_output, const Tensor& input, const Tensor& mean,            \
                                   const Tensor& inv_std, const Tensor& weight, const Tensor& sum_dy,             \
                                   const Tensor& sum_dy_xmu, const Tensor& count, Layout layout,                  \
                                   Tensor& grad_input);                                                           \
  }

APEX_SYNCBN_DECLARE_KERNELS(CpuKernels);
APEX_SYNCBN_DECLARE_KERNELS(CudaKernels);

template <typename Kernels>
struct SyncBNOps {
  // Per-channel mean and biased variance of one process's input.
  static std::tuple<Tensor, Tensor> welford_mean_var(const Tensor& input_, bool channels_last) {
    const char* op = channels_last ? "syncbn.welford_mean_var_c_last" : "syncbn.welford_mean_var";
    const Layout layout = layout_of(input_, channels_last, op);
    const Tensor input = input_.contiguous();
    Tensor mean = channel_output(input, layout.channels, accumulation_dtype(input));
    Tensor var_biased = channel_output(input, layout.channels, accumulation_dtype(input));
    if (input.numel() > 0) Kernels::welford_mean_var(input, layout, mean, var_biased);
    return {mean, var_biased};
  }

  // Merges per-rank statistics ([world, C] means and biased variances, [world] counts)
  // into the global mean, unbiased variance and 1 / sqrt(biased variance + eps).
  static std::tuple<Tensor, Tensor, Tensor> welford_parallel(const Tensor& mean_, const Tensor& var_biased_,
                                                             const Tensor& count_, double eps) {
    const char* op = "syncbn.welford_parallel";
    APEX_CHECK(mean_.dim() == 2 && mean_.size(0) > 0 && mean_.size(1) > 0, op,
               ": mean must have shape [world_size, channels], got ", mean_.sizes());
    APEX_CHECK(at::isFloatingType(mean_.scalar_type()), op, ": mean must be floating point, got ", mean_.scalar_type());
    APEX_CHECK(var_biased_.sizes() == mean_.sizes(), op, ": var_biased must have the shape of mean ", mean_.sizes(),
               ", got ", var_biased_.sizes());
    APEX_CHECK(count_.dim() == 1 && count_.size(0) == mean_.size(0), op, ": count must have shape [", mean_.size(0),
               "], got ", count_.sizes());
    APEX_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
    check_same_device(mean_, var_biased_, op, "var_biased");
    check_same_device(mean_, count_, op, "count");
    const auto acc = accumulation_dtype(mean_);
    const Tensor mean = mean_.to(acc).contiguous();
    const Tensor var_biased = var_biased_.to(acc).contiguous();
    const Tensor count = count_.to(at::kLong).contiguous();
    Tensor out_mean = at::empty({mean.size(1)}, mean.options());
    Tensor out_var = at::empty_like(out_mean);
    Tensor inv_std = at::empty_like(out_mean);
    Kernels::welford_parallel(mean, var_biased, count, eps, out_mean, out_var, inv_std);
    return {out_mean, out_var, inv_std};
  }

  // y = (x - mean) * inv_std * weight + shift [+ z] [then relu]; z and relu only channels-last.
  static Tensor batchnorm_forward(const Tensor& input_, const OptTensor& z_, const Tensor& mean_,
                                  const Tensor& inv_std_, const OptTensor& weight_, const OptTensor& shift_,
                                  bool fuse_relu, bool channels_last) {
    const char* op = channels_last ? "syncbn.batchnorm_forward_c_last" : "syncbn.batchnorm_forward";
    const Layout layout = layout_of(input_, channels_last, op);
    const Tensor input = input_.contiguous();
    const NormalizeArgs args = normalize_args(input, layout, mean_, inv_std_, weight_, shift_, z_, op);
    Tensor out = at::empty_like(input);
    if (input.numel() > 0) Kernels::batchnorm_forward(input, args, fuse_relu, layout, out);
    return out;
  }

  // grad_output with zeros where the fused forward's relu clipped (channels-last only).
  static Tensor relu_bw_c_last(const Tensor& grad_output_, const Tensor& input_, const OptTensor& z_,
                               const Tensor& mean_, const Tensor& inv_std_, const OptTensor& weight_,
                               const OptTensor& shift_) {
    const char* op = "syncbn.relu_bw_c_last";
    const Layout layout = layout_of(input_, /*channels_last=*/true, op);
    const Tensor input = input_.contiguous();
    const Tensor grad_output = like_input(input, grad_output_, op, "grad_output");
    const NormalizeArgs args = normalize_args(input, layout, mean_, inv_std_, weight_, shift_, z_, op);
    Tensor out = at::empty_like(input);
    if (input.numel() > 0) Kernels::relu_backward(grad_output, input, args, layout, out);
    return out;
  }

  // {sum(dy), sum(dy * (x - mean)), grad_weight, grad_bias} per channel. Without a
  // weight, grad_weight and grad_bias are empty (as in NVIDIA apex).
  static std::tuple<Tensor, Tensor, Tensor, Tensor> reduce_bn(const Tensor& grad_output_, const Tensor& input_,
                                                              const Tensor& mean_, const Tensor& inv_std_,
                                                              const OptTensor& weight_, bool channels_last) {
    const char* op = channels_last ? "syncbn.reduce_bn_c_last" : "syncbn.reduce_bn";
    const Layout layout = layout_of(input_, channels_last, op);
    const Tensor input = input_.contiguous();
    const Tensor grad_output = like_input(input, grad_output_, op, "grad_output");
    const Tensor mean = channel_vector(input, mean_, layout.channels, op, "mean");
    const Tensor inv_std = channel_vector(input, inv_std_, layout.channels, op, "inv_std");
    const bool affine = weight_.has_value() && weight_->defined();
    if (affine) check_channel_vector(input, *weight_, layout.channels, op, "weight");  // only its dtype is used
    Tensor sum_dy = channel_output(input, layout.channels, mean.scalar_type());
    Tensor sum_dy_xmu = channel_output(input, layout.channels, mean.scalar_type());
    if (input.numel() > 0) Kernels::reduce_bn(grad_output, input, mean, layout, sum_dy, sum_dy_xmu);
    if (!affine) return {sum_dy, sum_dy_xmu, at::empty({0}, mean.options()), at::empty({0}, mean.options())};
    const auto weight_dtype = weight_->scalar_type();
    return {sum_dy, sum_dy_xmu, (sum_dy_xmu * inv_std).to(weight_dtype), sum_dy.to(weight_dtype)};
  }

  // dx = (dy - sum_dy / n - (x - mean) * inv_std^2 * sum_dy_xmu / n) * inv_std * weight,
  // where n = count.sum() is the global number of elements per channel.
  static Tensor batchnorm_backward(const Tensor& grad_output_, const Tensor& input_, const Tensor& mean_,
                                   const Tensor& inv_std_, const OptTensor& weight_, const Tensor& sum_dy_,
                                   const Tensor& sum_dy_xmu_, const Tensor& count_, bool channels_last) {
    const char* op = channels_last ? "syncbn.batchnorm_backward_c_last" : "syncbn.batchnorm_backward";
    const Layout layout = layout_of(input_, channels_last, op);
    const Tensor input = input_.contiguous();
    const Tensor grad_output = like_input(input, grad_output_, op, "grad_output");
    const Tensor mean = channel_vector(input, mean_, layout.channels, op, "mean");
    const Tensor inv_std = channel_vector(input, inv_std_, layout.channels, op, "inv_std");
    const Tensor weight = optional_channel_vector(input, weight_, layout.channels, op, "weight");
    const Tensor sum_dy = channel_vector(input, sum_dy_, layout.channels, op, "sum_dy");
    const Tensor sum_dy_xmu = channel_vector(input, sum_dy_xmu_, layout.channels, op, "sum_dy_xmu");
    const Tensor count = counts_vector(input, count_, op);
    Tensor grad_input = at::empty_like(input);
    if (input.numel() > 0) {
      Kernels::batchnorm_backward(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count, layout,
                                  grad_input);
    }
    return grad_input;
  }

  // Adapters with the dispatcher schemas' argument lists (see binding.cpp).
  static std::tuple<Tensor, Tensor> welford_mean_var_nchw(const Tensor& input) { return welford_mean_var(input, false); }
  static std::tuple<Tensor, Tensor> welford_mean_var_c_last(const Tensor& input) { return welford_mean_var(input, true); }
  static Tensor batchnorm_forward_nchw(const Tensor& input, const Tensor& mean, const Tensor& inv_std,
                                       const OptTensor& weight, const OptTensor& shift) {
    return batchnorm_forward(input, c10::nullopt, mean, inv_std, weight, shift, false, false);
  }
  static Tensor batchnorm_forward_c_last(const Tensor& input, const OptTensor& z, const Tensor& mean,
                                         const Tensor& inv_std, const OptTensor& weight, const OptTensor& shift,
                                         bool fuse_relu) {
    return batchnorm_forward(input, z, mean, inv_std, weight, shift, fuse_relu, true);
  }
  static std::tuple<Tensor, Tensor, Tensor, Tensor> reduce_bn_nchw(const Tensor& grad_output, const Tensor& input,
                                                                   const Tensor& mean, const Tensor& inv_std,
                                                                   const OptTensor& weight) {
    return reduce_bn(grad_output, input, mean, inv_std, weight, false);
  }
  static std::tuple<Tensor, Tensor, Tensor, Tensor> reduce_bn_c_last(const Tensor& grad_output, const Tensor& input,
                                                                     const Tensor& mean, const Tensor& inv_std,
                                                                     const OptTensor& weight) {
    return reduce_bn(grad_output, input, mean, inv_std, weight, true);
  }
  static Tensor batchnorm_backward_nchw(const Tensor& grad_output, const Tensor& input, const Tensor& mean,
                                        const Tensor& inv_std, const OptTensor& weight, const Tensor& sum_dy,
                                        const Tensor& sum_dy_xmu, const Tensor& count) {
    return batchnorm_backward(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count, false);
  }
  static Tensor batchnorm_backward_c_last(const Tensor& grad_output, const Tensor& input, const Tensor& mean,
                                          const Tensor& inv_std, const OptTensor& weight, const Tensor& sum_dy,
                                          const Tensor& sum_dy_xmu, const Tensor& count) {
    return batchnorm_backward(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count, true);
  }
};

// Registers SyncBNOps<Kernels> as the implementation of every syncbn op for one dispatch key.
#define APEX_SYNCBN_REGISTER_KERNELS(m, Kernels)                                            \
  do {                                                                                      \
    using Ops = ::apex_syncbn::SyncBNOps<Kernels>;                                          \
    m.impl("syncbn_welford_mean_var", &Ops::welford_mean_var_nchw);                         \
    m.impl("syncbn_welford_mean_var_c_last", &Ops::welford_mean_var_c_last);                \
    m.impl("syncbn_welford_parallel", &Ops::welford_parallel);                              \
    m.impl("syncbn_batchnorm_forward", &Ops::batchnorm_forward_nchw);                       \
    m.impl("syncbn_batchnorm_forward_c_last", &Ops::batchnorm_forward_c_last);              \
    m.impl("syncbn_reduce_bn", &Ops::reduce_bn_nchw);                                       \
    m.impl("syncbn_reduce_bn_c_last", &Ops::reduce_bn_c_last);                              \
    m.impl("syncbn_batchnorm_backward", &Ops::batchnorm_backward_nchw);                     \
    m.impl("syncbn_batchnorm_backward_c_last", &Ops::batchnorm_backward_c_last);            \
    m.impl("syncbn_relu_bw_c_last", &Ops::relu_bw_c_last);                                  \
  } while (0)

}  // namespace apex_syncbn
