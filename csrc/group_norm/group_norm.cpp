// group_norm: the ops (schema, checks, outputs, autograd), each declared once.
#include <ATen/ops/full.h>
#include <ATen/ops/empty.h>

#include "apex/autograd.h"
#include "group_norm.h"

namespace apex::group_norm {
namespace {

// x [N, C, *] floating; C divisible by num_groups; weight / bias [C] on x's device.
Dtype check_inputs(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& weight,
                   const std::optional<at::Tensor>& bias, const char* op) {
  const Dtype dtype = floating_dtype(x, op, "x");
  APEX_CHECK(x.dim() >= 2, op, ": x must be [N, C, *] (at least 2-D), got shape ", x.sym_sizes());
  APEX_CHECK(num_groups > 0 && x.sym_size(1) % num_groups == 0, op, ": the channels (", x.sym_size(1),
             ") must be a multiple of num_groups (", num_groups, ")");
  for (const auto& [p, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!p->has_value() || !(*p)->defined()) continue;
    const at::Tensor& t = **p;
    APEX_CHECK(t.dim() == 1 && t.sym_size(0) == x.sym_size(1), op, ": ", name, " must have shape [",
               x.sym_size(1), "] (one per channel), got ", t.sym_sizes());
    floating_dtype(t, op, name);
    check_same_device(t, x, op, name, "x");
  }
  return dtype;
}

bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// NHWC when x is stored channels-last (4-D or 5-D), else NCHW.
at::MemoryFormat layout_of(const at::Tensor& x) {
  if (x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast) && !x.is_contiguous()) {
    return at::MemoryFormat::ChannelsLast;
  }
  if (x.dim() == 5 && x.is_contiguous(at::MemoryFormat::ChannelsLast3d) && !x.is_contiguous()) {
    return at::MemoryFormat::ChannelsLast3d;
  }
  return at::MemoryFormat::Contiguous;
}

Shape shape_of(const at::Tensor& x, int64_t num_groups, at::MemoryFormat format) {
  const int64_t samples = x.size(0), channels = x.size(1);
  const int64_t spatial = samples * channels == 0 ? 1 : x.numel() / (samples * channels);
  return {samples, channels, num_groups, spatial,
          format == at::MemoryFormat::Contiguous ? Layout::kNchw : Layout::kNhwc};
}

// A parameter as the kernels read it: Acc-typed (a no-op for float32 params of 16-bit or float32
// data), or absent.
const void* param_data(const std::optional<at::Tensor>& p, at::ScalarType acc, at::Tensor& keep) {
  if (!defined(p)) return nullptr;
  keep = p->to(acc).contiguous();
  return keep.const_data_ptr();
}

template <class Device>
at::Tensor workspace_for(const Device& device, const Shape& shape, Dtype dtype, const at::Tensor& like) {
  return at::empty({workspace_bytes(device, shape, dtype)}, like.options().dtype(at::kByte));
}

}  // namespace

// (grad_x, grad_weight, grad_bias) of group_norm_forward's y given grad_y; grad_weight and
// grad_bias are empty when weight / bias is None.
struct Backward {
  static constexpr const char* kSchema =
      "group_norm_backward(Tensor grad_y, Tensor x, Tensor mean, Tensor rstd, int num_groups, Tensor? weight, "
      "Tensor? bias, bool silu=False) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> call(const at::Tensor& grad_y, const at::Tensor& x,
                                                             const at::Tensor& mean, const at::Tensor& rstd,
                                                             int64_t num_groups, const std::optional<at::Tensor>& weight,
                                                             const std::optional<at::Tensor>& bias, bool silu) {
    constexpr const char* op = "group_norm_backward";
    const Dtype dtype = check_inputs(x, num_groups, weight, bias, op);
    APEX_CHECK(grad_y.sym_sizes() == x.sym_sizes() && grad_y.scalar_type() == x.scalar_type(), op,
               ": grad_y must have x's shape and dtype (", x.sym_sizes(), ", ", x.scalar_type(), "), got ",
               grad_y.sym_sizes(), ", ", grad_y.scalar_type());
    check_same_device(grad_y, x, op, "grad_y", "x");
    const at::ScalarType acc = statistics_dtype(x.scalar_type());
    for (const auto* stat : {&mean, &rstd}) {
      APEX_CHECK(stat->scalar_type() == acc && stat->sym_numel() == x.sym_size(0) * num_groups, op,
                 ": mean and rstd must be group_norm_forward's [N, num_groups] ", acc, " outputs, got ",
                 stat->scalar_type(), " of shape ", stat->sym_sizes());
      check_same_device(*stat, x, op, "mean / rstd", "x");
    }
    const at::MemoryFormat format = layout_of(x);
    at::Tensor grad_x = at::empty_symint(x.sym_sizes(), x.options().memory_format(format));
    const auto param_grad = [&](const std::optional<at::Tensor>& p) {
      return defined(p) ? at::empty_symint(p->sym_sizes(), p->options()) : at::empty({0}, x.options());
    };
    at::Tensor grad_weight = param_grad(weight), grad_bias = param_grad(bias);
    launch<Device>(x, [&](const auto& device) {
      const at::Tensor input = x.contiguous(format), dy = grad_y.contiguous(format);
      const at::Tensor means = mean.contiguous(), rstds = rstd.contiguous();
      const Shape shape = shape_of(input, num_groups, format);
      at::Tensor w, b;
      at::Tensor dw = defined(weight) ? at::empty({shape.channels}, x.options().dtype(acc)) : at::Tensor();
      at::Tensor db = defined(bias) ? at::empty({shape.channels}, x.options().dtype(acc)) : at::Tensor();
      at::Tensor workspace = workspace_for(device, shape, dtype, x);
      backward(device, BackwardArgs{shape, dtype, input.const_data_ptr(), dy.const_data_ptr(), param_data(weight, acc, w),
                                    param_data(bias, acc, b), means.const_data_ptr(), rstds.const_data_ptr(), silu,
                                    grad_x.mutable_data_ptr(), dw.defined() ? dw.mutable_data_ptr() : nullptr,
                                    db.defined() ? db.mutable_data_ptr() : nullptr, workspace.mutable_data_ptr()});
      if (dw.defined()) grad_weight.copy_(dw);
      if (db.defined()) grad_bias.copy_(db);
    });
    return {grad_x, grad_weight, grad_bias};
  }
};

// y = act(group_norm(x) * weight + bias) with the per-(sample, group) mean and rstd
// ([N, num_groups], float32; float64 for float64 x). y keeps x's layout (channels-last stays so);
// differentiable in x, weight and bias.
struct Forward {
  static constexpr const char* kSchema =
      "group_norm_forward(Tensor x, int num_groups, Tensor? weight, Tensor? bias, float eps=1e-05, "
      "bool silu=False) -> (Tensor y, Tensor mean, Tensor rstd)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> call(const at::Tensor& x, int64_t num_groups,
                                                             const std::optional<at::Tensor>& weight,
                                                             const std::optional<at::Tensor>& bias, double eps,
                                                             bool silu) {
    const Dtype dtype = check_inputs(x, num_groups, weight, bias, "group_norm_forward");
    const at::ScalarType acc = statistics_dtype(x.scalar_type());
    const at::MemoryFormat format = layout_of(x);
    at::Tensor y = at::empty_symint(x.sym_sizes(), x.options().memory_format(format));
    at::Tensor mean = at::empty_symint({x.sym_size(0), num_groups}, x.options().dtype(acc));
    at::Tensor rstd = at::empty_symint({x.sym_size(0), num_groups}, x.options().dtype(acc));
    launch<Device>(x, [&](const auto& device) {
      const at::Tensor input = x.contiguous(format);
      const Shape shape = shape_of(input, num_groups, format);
      if (input.numel() == 0) {  // no values: no moments (torch's are NaN too)
        mean.fill_(std::numeric_limits<double>::quiet_NaN());
        rstd.fill_(std::numeric_limits<double>::quiet_NaN());
      }
      at::Tensor w, b;
      at::Tensor workspace = workspace_for(device, shape, dtype, x);
      forward(device, ForwardArgs{shape, dtype, input.const_data_ptr(), param_data(weight, acc, w), param_data(bias, acc, b),
                                  eps, silu, y.mutable_data_ptr(), mean.mutable_data_ptr(), rstd.mutable_data_ptr(),
                                  workspace.mutable_data_ptr()});
    });
    return {y, mean, rstd};
  }

  static void save(AutogradContext& ctx, const at::Tensor& x, int64_t num_groups,
                   const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double /*eps*/,
                   bool silu, const std::tuple<at::Tensor, at::Tensor, at::Tensor>& outputs) {
    ctx.save_for_backward({x, std::get<1>(outputs), std::get<2>(outputs), weight.value_or(at::Tensor()),
                           bias.value_or(at::Tensor())});
    ctx.saved_data["num_groups"] = num_groups;
    ctx.saved_data["silu"] = silu;
    ctx.mark_non_differentiable({std::get<1>(outputs), std::get<2>(outputs)});
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[0].defined()) return {};
    const auto saved = ctx.get_saved_variables();
    const auto optional = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
    auto [grad_x, grad_weight, grad_bias] =
        call_op<Backward>(grads[0], saved[0], saved[1], saved[2], ctx.saved_data["num_groups"].toInt(),
                          optional(saved[3]), optional(saved[4]), ctx.saved_data["silu"].toBool());
    return {grad_x, at::Tensor(), saved[3].defined() ? grad_weight : at::Tensor(),
            saved[4].defined() ? grad_bias : at::Tensor()};
  }
};

APEX_LIBRARY(m) {
  define_differentiable<Forward>(m);
  define<Backward>(m);
}

}  // namespace apex::group_norm
