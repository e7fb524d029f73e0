// fused_bias_swiglu: the ops (schema, argument checks, outputs, autograd), each declared once;
// apex/op.h turns them into torch.ops.apex.fused_bias_swiglu_* with CPU, CUDA and Meta kernels.
// The historical module fused_bias_swiglu (ROCm apex) is their face: forward(x, bias),
// backward(grad, x, bias).
#include "apex/autograd.h"
#include "fused_swiglu.h"

namespace apex::fused_swiglu {
namespace {

// x [..., 2H] and bias [2H] (or none), one floating dtype on one device; returns the dtype.
Dtype check_input_and_bias(const at::Tensor& x, const std::optional<at::Tensor>& bias, const char* op) {
  const Dtype dtype = floating_dtype(x, op, "input");
  APEX_CHECK(x.dim() >= 1, op, ": input must have at least one dimension, got a scalar");
  const c10::SymInt width = x.sym_size(-1);
  APEX_CHECK(width % 2 == 0, op, ": the last dimension of input holds the gate and up halves, so it must be even; got ",
             "shape ", x.sym_sizes());
  if (bias.has_value() && bias->defined()) {
    APEX_CHECK(bias->scalar_type() == x.scalar_type(), op, ": bias must have input's dtype ", x.scalar_type(),
               ", got ", bias->scalar_type());
    APEX_CHECK(bias->dim() == 1 && bias->sym_size(0) == width, op, ": bias must have shape [", width,
               "] (the last dimension of input), got ", bias->sym_sizes());
    check_same_device(*bias, x, op, "bias", "input");
  }
  return dtype;
}

// The output shape: input's with the last dimension halved.
std::vector<c10::SymInt> halved(const at::Tensor& x) {
  std::vector<c10::SymInt> sizes(x.sym_sizes().begin(), x.sym_sizes().end());
  sizes.back() = sizes.back() / 2;
  return sizes;
}

const void* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->const_data_ptr() : nullptr;
}

// grad_x (and grad_bias when wanted) of forward(x, bias) given grad_y.
template <class Device>
std::tuple<at::Tensor, at::Tensor> backward_impl(const at::Tensor& grad_y, const at::Tensor& x,
                                                 const std::optional<at::Tensor>& bias, bool want_bias_grad,
                                                 const char* op) {
  const Dtype dtype = check_input_and_bias(x, bias, op);
  APEX_CHECK(grad_y.scalar_type() == x.scalar_type(), op, ": grad_output must have input's dtype ", x.scalar_type(),
             ", got ", grad_y.scalar_type());
  check_same_device(grad_y, x, op, "grad_output", "input");
  const std::vector<c10::SymInt> y_sizes = halved(x);
  APEX_CHECK(grad_y.sym_sizes() == c10::SymIntArrayRef(y_sizes), op, ": grad_output must have shape ",
             c10::SymIntArrayRef(y_sizes), " (input's with the last dimension halved), got ", grad_y.sym_sizes());
  at::Tensor grad_x = at::empty_symint(x.sym_sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor grad_bias;
  if (want_bias_grad) grad_bias = at::empty_symint({x.sym_size(-1)}, x.options());
  launch<Device>(x, [&](const auto& device) {
    const at::Tensor input = x.contiguous(), grad = grad_y.contiguous();
    const std::optional<at::Tensor> b = bias.has_value() && bias->defined() ? std::optional(bias->contiguous())
                                                                            : std::nullopt;
    const int64_t half = x.size(-1) / 2, rows = half == 0 ? 0 : x.numel() / (2 * half);
    at::Tensor workspace;
    if (want_bias_grad) {
      workspace = at::empty({bias_grad_workspace_bytes(device, rows, half, dtype)}, x.options().dtype(at::kByte));
    }
    backward(device, BackwardArgs{grad.const_data_ptr(), input.const_data_ptr(), data_or_null(b),
                                  grad_x.mutable_data_ptr(), want_bias_grad ? grad_bias.mutable_data_ptr() : nullptr,
                                  want_bias_grad ? workspace.mutable_data_ptr() : nullptr, rows, half, dtype});
  });
  return {grad_x, grad_bias};
}

}  // namespace

// Gradient of fused_bias_swiglu_forward with respect to its input (the historical backward).
struct Backward {
  static constexpr const char* kSchema =
      "fused_bias_swiglu_backward(Tensor grad_output, Tensor input, Tensor? bias=None) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
    return std::get<0>(backward_impl<Device>(grad_y, x, bias, false, "fused_bias_swiglu_backward"));
  }
};

// Gradients with respect to input and bias in one pass over the data (the bias gradient is summed
// while grad_input is written, not read back afterwards).
struct BackwardWithBias {
  static constexpr const char* kSchema =
      "fused_bias_swiglu_backward_with_bias(Tensor grad_output, Tensor input, Tensor bias) -> "
      "(Tensor grad_input, Tensor grad_bias)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& bias) {
    return backward_impl<Device>(grad_y, x, bias, true, "fused_bias_swiglu_backward_with_bias");
  }
};

// y [..., H] = silu(x[..., :H] + bias[:H]) * (x[..., H:] + bias[H:]) for input [..., 2H] and bias
// [2H] (optional); float32, float16, bfloat16 or float64; differentiable in input and bias.
struct Forward {
  static constexpr const char* kSchema = "fused_bias_swiglu_forward(Tensor input, Tensor? bias=None) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& x, const std::optional<at::Tensor>& bias) {
    const Dtype dtype = check_input_and_bias(x, bias, "fused_bias_swiglu_forward");
    at::Tensor y = at::empty_symint(halved(x), x.options().memory_format(at::MemoryFormat::Contiguous));
    launch<Device>(x, [&](const auto& device) {
      const at::Tensor input = x.contiguous();
      const std::optional<at::Tensor> b = bias.has_value() && bias->defined() ? std::optional(bias->contiguous())
                                                                              : std::nullopt;
      const int64_t half = x.size(-1) / 2, rows = half == 0 ? 0 : x.numel() / (2 * half);
      forward(device, ForwardArgs{input.const_data_ptr(), data_or_null(b), y.mutable_data_ptr(), rows, half, dtype});
    });
    return y;
  }

  static void save(AutogradContext& ctx, const at::Tensor& x, const std::optional<at::Tensor>& bias,
                   const at::Tensor& /*y*/) {
    ctx.save_for_backward({x, bias.value_or(at::Tensor())});
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    const auto saved = ctx.get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& bias = saved[1];
    // Autograd's edges are the defined tensor inputs: input, then bias when there is one.
    if (bias.defined() && ctx.needs_input_grad(1)) {
      auto [grad_x, grad_bias] = call_op<BackwardWithBias>(grads[0], x, bias);
      return {grad_x, grad_bias};
    }
    return {call_op<Backward>(grads[0], x, bias.defined() ? std::optional(bias) : std::nullopt)};
  }
};

APEX_LIBRARY(m) {
  define_differentiable<Forward>(m);
  define<Backward>(m);
  define<BackwardWithBias>(m);
}

}  // namespace apex::fused_swiglu
