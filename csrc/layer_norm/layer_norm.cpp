// fused_layer_norm_cuda: the LayerNorm / RMSNorm op functions, each declared once (schema, argument
// checks, outputs, autograd formula); apex/op.h turns them into torch.ops.apex.* ops with CPU, CUDA
// and Meta (shape) kernels.
//
//   layer_norm_fwd / rms_norm_fwd   differentiable (formula below), what apex.normalization calls
//   layer_norm_bwd / rms_norm_bwd   their gradients (NVIDIA apex's backward / backward_affine)
#include <ATen/ops/any.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/fill.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>

#include "apex/autograd.h"
#include "apex/torch_scratch.h"
#include "layer_norm.h"

namespace apex::layer_norm {
namespace {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

bool defined(const OptionalTensor& t) { return t.has_value() && t->defined(); }

// The [rows, cols] view every kernel takes: cols = prod(normalized_shape), which must be the
// trailing dimensions of `t`; rows = the product of the others. Symbolic under torch.compile.
struct Rows {
  c10::SymInt rows, cols;
};

Rows rows_of(const char* op, const char* what, const Tensor& t, c10::SymIntArrayRef normalized_shape) {
  const int64_t n = static_cast<int64_t>(normalized_shape.size());
  APEX_CHECK(n >= 1, op, ": normalized_shape must name at least one dimension");
  const auto fail = [&] {
    return message(op, ": normalized_shape ", normalized_shape, " must equal the trailing dimensions of ", what,
                   " (shape ", t.sym_sizes(), ")");
  };
  APEX_CHECK(t.dim() >= n, fail());
  Rows view{1, 1};
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d < t.dim() - n) {
      view.rows *= t.sym_size(d);
    } else {
      APEX_CHECK(t.sym_size(d).sym_eq(normalized_shape[d - (t.dim() - n)]), fail());
      view.cols *= t.sym_size(d);
    }
  }
  // The CUDA kernels index within a row in 32 bits.
  APEX_CHECK(view.cols.sym_le(std::numeric_limits<int32_t>::max()), op, ": rows of more than 2^31 - 1 elements (",
             view.cols, ") are not supported");
  return view;
}

// The parameters' dtype, which is the output's: the input's, or float32 for a 16-bit input (NVIDIA
// apex's "mixed dtypes"); the input's when there are none.
at::ScalarType output_dtype(const char* op, const Tensor& input, const OptionalTensor& weight,
                            const OptionalTensor& bias) {
  const OptionalTensor& defining = defined(weight) ? weight : bias;
  if (!defined(defining)) return input.scalar_type();
  const at::ScalarType dtype = defining->scalar_type(), data = input.scalar_type();
  const bool sixteen_bit = data == at::kHalf || data == at::kBFloat16;
  APEX_CHECK(dtype == data || (sixteen_bit && dtype == at::kFloat), op, ": weight/bias dtype ", dtype,
             " is incompatible with input dtype ", data,
             " (use the same dtype, or float32 parameters with a float16/bfloat16 input)");
  return dtype;
}

// weight / bias: on input's device, of shape normalized_shape and of the output dtype.
void check_parameter(const char* op, const char* name, const OptionalTensor& p, const Tensor& input,
                     c10::SymIntArrayRef normalized_shape, at::ScalarType dtype) {
  if (!defined(p)) return;
  check_same_device(*p, input, op, name, "input");
  APEX_CHECK(p->sym_sizes().size() == normalized_shape.size(), op, ": ", name, " has shape ", p->sym_sizes(),
             " but normalized_shape is ", normalized_shape);
  for (size_t d = 0; d < normalized_shape.size(); ++d) {
    APEX_CHECK(p->sym_size(d).sym_eq(normalized_shape[d]), op, ": ", name, " has shape ", p->sym_sizes(),
               " but normalized_shape is ", normalized_shape);
  }
  APEX_CHECK(p->scalar_type() == dtype, op, ": ", name, " has dtype ", p->scalar_type(), ", expected ", dtype,
             " (the other parameter's, which must be the input's, or float32 with a float16/bfloat16 input)");
}

// A row statistic handed to the backward: one per row, on grad_output's device, floating point.
Tensor checked_statistic(const char* op, const char* name, const Tensor& s, const c10::SymInt& rows,
                         const Tensor& like, at::ScalarType dtype) {
  check_same_device(s, like, op, name, "grad_output");
  APEX_CHECK(s.sym_numel().sym_eq(rows), op, ": ", name, " has ", s.sym_numel(), " elements, expected one per row (",
             rows, ")");
  APEX_CHECK(s.scalar_type() == at::kFloat || s.scalar_type() == at::kDouble, op, ": ", name,
             " must be float32 or float64, got ", s.scalar_type());
  return s.contiguous().to(dtype);
}

// The kernels' name for the output dtype output_dtype() chose: the input's, or float32.
Dtype output_kernel_dtype(Dtype input_dtype, const Tensor& input, at::ScalarType out_dtype) {
  return out_dtype == input.scalar_type() ? input_dtype : Dtype::kFloat32;
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }
void* mutable_data_or_null(const Tensor& t) { return t.defined() ? t.mutable_data_ptr() : nullptr; }
Tensor contiguous_or_undefined(const OptionalTensor& t) { return defined(t) ? t->contiguous() : Tensor(); }

// A forward call, checked and with its outputs allocated (RMSNorm: no mean, no bias). Not a template:
// only the launch below depends on the device, so the checks compile once, not once per device.
struct ForwardCall {
  Tensor input, weight, bias, output, mean, invvar;
  Rows view;
  Dtype input_dtype, output_dtype;
  double eps;
  bool rms;

  // Real tensors only (inside launch<>): false, with the statistics filled, when there is nothing to
  // normalize (no rows, or empty rows: mean 0 and variance 0 / 0, as torch reports them).
  bool has_work() const {
    if (view.rows.expect_int() == 0) return false;
    if (view.cols.expect_int() > 0) return true;
    if (mean.defined()) mean.fill_(0);
    invvar.fill_(std::numeric_limits<double>::quiet_NaN());
    return false;
  }

  ForwardArgs args() const {
    return {input.const_data_ptr(), data_or_null(weight), data_or_null(bias), output.mutable_data_ptr(),
            mutable_data_or_null(mean), invvar.mutable_data_ptr(), view.rows.expect_int(), view.cols.expect_int(),
            input_dtype, output_dtype, eps, rms};
  }
};

ForwardCall prepare_forward(const char* op, const Tensor& x, c10::SymIntArrayRef normalized_shape,
                            const OptionalTensor& w, const OptionalTensor& b, double eps, bool rms) {
  ForwardCall call;
  call.input_dtype = floating_dtype(x, op, "input");
  call.view = rows_of(op, "input", x, normalized_shape);
  const at::ScalarType out_dtype = output_dtype(op, x, w, b);
  check_parameter(op, "weight", w, x, normalized_shape, out_dtype);
  check_parameter(op, "bias", b, x, normalized_shape, out_dtype);
  call.output_dtype = output_kernel_dtype(call.input_dtype, x, out_dtype);
  call.input = x.contiguous();
  call.weight = contiguous_or_undefined(w);
  call.bias = contiguous_or_undefined(b);
  call.output = at::empty_symint(x.sym_sizes(), x.options().dtype(out_dtype));
  const auto statistics = x.options().dtype(statistics_dtype(x.scalar_type()));
  if (!rms) call.mean = at::empty_symint({call.view.rows}, statistics);
  call.invvar = at::empty_symint({call.view.rows}, statistics);
  call.eps = eps;
  call.rms = rms;
  return call;
}

template <class Device>
std::tuple<Tensor, Tensor, Tensor> normalize(const char* op, const Tensor& x, c10::SymIntArrayRef normalized_shape,
                                             const OptionalTensor& w, const OptionalTensor& b, double eps, bool rms) {
  const ForwardCall call = prepare_forward(op, x, normalized_shape, w, b, eps, rms);
  launch<Device>(call.input, [&](const auto& device) {
    if (call.has_work()) forward(device, call.args());
  });
  return {call.output, call.mean, call.invvar};
}

// A backward call, checked and with its outputs allocated: grad_input, and grad_weight / grad_bias
// (empty when weight / bias is None).
struct BackwardCall {
  Tensor grad_output, input_or_output, mean, invvar, weight, bias, grad_input, grad_weight, grad_bias;
  Rows view;
  Dtype input_dtype, output_dtype;
  double eps;
  bool rms, memory_efficient;

  // Real tensors only: false, with the parameter grads zeroed (sums of nothing), when there are no rows.
  bool has_work() const {
    if (view.rows.expect_int() > 0 && view.cols.expect_int() > 0) return true;
    if (weight.defined()) grad_weight.zero_();
    if (bias.defined()) grad_bias.zero_();
    return false;
  }

  BackwardArgs args() const {
    return {grad_output.const_data_ptr(), input_or_output.const_data_ptr(), data_or_null(mean),
            invvar.const_data_ptr(), data_or_null(weight), memory_efficient ? data_or_null(bias) : nullptr,
            grad_input.mutable_data_ptr(), weight.defined() ? grad_weight.mutable_data_ptr() : nullptr,
            bias.defined() ? grad_bias.mutable_data_ptr() : nullptr, view.rows.expect_int(), view.cols.expect_int(),
            input_dtype, output_dtype, eps, rms, memory_efficient};
  }
};

BackwardCall prepare_backward(const char* op, const Tensor& dy, const OptionalTensor& mean_in,
                              const Tensor& invvar_in, const Tensor& x_or_y, c10::SymIntArrayRef normalized_shape,
                              const OptionalTensor& w, const OptionalTensor& b, double eps, bool memory_efficient,
                              bool rms) {
  BackwardCall call;
  call.input_dtype = floating_dtype(x_or_y, op, "input_or_output");
  floating_dtype(dy, op, "grad_output");
  call.view = rows_of(op, "input_or_output", x_or_y, normalized_shape);
  check_same_device(dy, x_or_y, op, "grad_output", "input_or_output");
  APEX_CHECK(dy.sym_sizes().equals(x_or_y.sym_sizes()), op, ": grad_output has shape ", dy.sym_sizes(),
             " but input_or_output has shape ", x_or_y.sym_sizes());
  const at::ScalarType out_dtype = output_dtype(op, x_or_y, w, b);
  APEX_CHECK(dy.scalar_type() == out_dtype, op, ": grad_output has dtype ", dy.scalar_type(),
             ", expected the forward output's dtype ", out_dtype);
  check_parameter(op, "weight", w, x_or_y, normalized_shape, out_dtype);
  check_parameter(op, "bias", b, x_or_y, normalized_shape, out_dtype);
  call.output_dtype = output_kernel_dtype(call.input_dtype, x_or_y, out_dtype);
  const at::ScalarType statistics = statistics_dtype(x_or_y.scalar_type());
  call.invvar = checked_statistic(op, "invvar", invvar_in, call.view.rows, dy, statistics);
  if (!rms && !memory_efficient) {
    APEX_CHECK(defined(mean_in), op, ": LayerNorm's backward needs mean (unless memory_efficient)");
    call.mean = checked_statistic(op, "mean", *mean_in, call.view.rows, dy, statistics);
  }
  call.grad_output = dy.contiguous();
  call.input_or_output = x_or_y.contiguous();
  call.weight = contiguous_or_undefined(w);
  call.bias = contiguous_or_undefined(b);
  call.grad_input = at::empty_symint(x_or_y.sym_sizes(), x_or_y.options());
  const auto grad_of = [&](const Tensor& p) {
    return p.defined() ? at::empty_symint(p.sym_sizes(), p.options()) : at::empty({0}, dy.options());
  };
  call.grad_weight = grad_of(call.weight);
  call.grad_bias = grad_of(call.bias);
  call.eps = eps;
  call.rms = rms;
  call.memory_efficient = memory_efficient;
  return call;
}

template <class Device>
std::tuple<Tensor, Tensor, Tensor> differentiate(const char* op, const Tensor& dy, const OptionalTensor& mean,
                                                 const Tensor& invvar, const Tensor& x_or_y,
                                                 c10::SymIntArrayRef normalized_shape, const OptionalTensor& w,
                                                 const OptionalTensor& b, double eps, bool memory_efficient, bool rms) {
  const BackwardCall call =
      prepare_backward(op, dy, mean, invvar, x_or_y, normalized_shape, w, b, eps, memory_efficient, rms);
  launch<Device>(call.input_or_output, [&](const auto& device) {
    if (!call.has_work()) return;
    if constexpr (std::is_same_v<std::decay_t<decltype(device)>, Cpu>) {
      backward(device, call.args());
    } else {
      Tensor scratch;
      backward(device, call.args(), torch_scratch(call.grad_output, scratch));
    }
  });
  return {call.grad_input, call.grad_weight, call.grad_bias};
}

// ---- the autograd formula both forward ops share ----------------------------------------------

// A real tensor whose values can be read (not a FakeTensor or functional wrapper while tracing).
bool readable(const Tensor& t) {
  constexpr c10::DispatchKeySet kTracing({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                          c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::FuncTorchBatched});
  return !t.is_meta() && !t.key_set().has_any(kTracing);
}

// Whether a CPU tensor of a floating dtype holds a zero, read in place (eq, any and item would be
// three dispatched ops, more host time than a small norm call itself).
bool has_zero_on_cpu(const Tensor& t) {
  const Tensor values = t.contiguous();
  return dispatch_floating(floating_dtype(values, "layer_norm_fwd", "weight"), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* data = values.const_data_ptr<T>();
    return std::any_of(data, data + values.numel(), [](T v) { return static_cast<double>(v) == 0.0; });
  });
}

// memory_efficient keeps the forward output y instead of the input: xhat = (y - bias) / weight.
// Where the weight has a zero, y holds only the bias and xhat (with every gradient that needs it) is
// lost, so the input is kept instead. Finding out reads the weight: a host sync on CUDA, paid only by
// memory_efficient calls that record a graph. While tracing, or while a CUDA graph is captured,
// nothing can be read back, and the input is kept.
bool keeps_output(bool memory_efficient, const OptionalTensor& weight) {
  if (!memory_efficient || !defined(weight)) return memory_efficient;
  if (!readable(*weight)) return false;
  if (weight->is_cpu()) return !has_zero_on_cpu(*weight);
#ifdef APEX_WITH_CUDA
  if (weight->is_cuda()) {
    bool capturing = false;
    launch<Cuda>(*weight, [&](const Cuda& device) { capturing = stream_is_capturing(device); });
    if (capturing) return false;
  }
#endif
  return !at::eq(*weight, 0).any().item<bool>();
}

// What the backward of a norm forward needs: the kept tensor (input, or output when memory
// efficient), the statistics, the parameters, and how to call the backward op.
void save_norm(AutogradContext& ctx, const Tensor& input, c10::SymIntArrayRef normalized_shape,
               const OptionalTensor& weight, const OptionalTensor& bias, double eps, bool memory_efficient,
               const Tensor& output, const Tensor& mean, const Tensor& invvar) {
  const bool keep_output = keeps_output(memory_efficient, weight);
  ctx.save_for_backward({keep_output ? output : input, mean, invvar, weight.value_or(Tensor()),
                         bias.value_or(Tensor())});
  ctx.saved_data["normalized_dims"] = static_cast<int64_t>(normalized_shape.size());
  ctx.saved_data["eps"] = eps;
  ctx.saved_data["kept_output"] = keep_output;
  ctx.saved_data["input_dtype"] = input.scalar_type();
  // mean / invvar get no gradient; without these autograd would zero-fill one for each.
  ctx.mark_non_differentiable(mean.defined() ? Grads{mean, invvar} : Grads{invvar});
  ctx.set_materialize_grads(false);
}

// Calls `backward_op(grad_output, mean, invvar, kept, normalized_shape, weight, bias, eps,
// memory_efficient)` (layer_norm_bwd's arguments) and returns the forward's grads: input, normalized_shape, weight, bias, eps,
// memory_efficient (the RMS forward has no bias: its eps and memory_efficient move up one).
template <class BackwardOp>
Grads norm_grads(AutogradContext& ctx, const Grads& grads, BackwardOp&& backward_op) {
  if (!grads[0].defined()) return {};  // only the statistics were used
  const Grads saved = ctx.get_saved_variables();
  const Tensor& kept = saved[0];
  const int64_t dims = ctx.saved_data["normalized_dims"].toInt();
  const c10::SymIntArrayRef normalized_shape = kept.sym_sizes().slice(kept.dim() - dims);
  const auto optional = [](const Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; };
  // A plain backward records nothing: straight to the kernel, past the backward op's Autograd kernel
  // (a boxed not-implemented check). Under create_graph it goes through that check, which refuses.
  std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
  if (!at::GradMode::is_enabled()) below_autograd.emplace();
  auto [grad_input, grad_weight, grad_bias] =
      backward_op(grads[0], optional(saved[1]), saved[2], kept, normalized_shape, optional(saved[3]),
                  optional(saved[4]), ctx.saved_data["eps"].toDouble(), ctx.saved_data["kept_output"].toBool());
  // memory_efficient with float32 parameters and a 16-bit input: the kept output is float32.
  const auto input_dtype = ctx.saved_data["input_dtype"].toScalarType();
  if (grad_input.scalar_type() != input_dtype) grad_input = grad_input.to(input_dtype);
  return {grad_input, Tensor(), saved[3].defined() ? grad_weight : Tensor(), saved[4].defined() ? grad_bias : Tensor()};
}

// ---- the ops ----------------------------------------------------------------------------------

// LayerNorm over the trailing `normalized_shape` dims: (output, mean, invvar), statistics [rows].
// memory_efficient does not change the result: it makes the backward keep the output, not the input.
struct LayerNormForward {
  static constexpr const char* kSchema =
      "layer_norm_fwd(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps, "
      "bool memory_efficient=False) -> (Tensor output, Tensor mean, Tensor invvar)";

  template <class Device>
  static std::tuple<Tensor, Tensor, Tensor> call(const Tensor& input, c10::SymIntArrayRef normalized_shape,
                                                 const OptionalTensor& weight, const OptionalTensor& bias, double eps,
                                                 bool /*memory_efficient: read by save()*/) {
    return normalize<Device>("layer_norm_fwd", input, normalized_shape, weight, bias, eps, /*rms=*/false);
  }

  static void save(AutogradContext& ctx, const Tensor& input, c10::SymIntArrayRef normalized_shape,
                   const OptionalTensor& weight, const OptionalTensor& bias, double eps, bool memory_efficient,
                   const std::tuple<Tensor, Tensor, Tensor>& outputs) {
    const auto& [output, mean, invvar] = outputs;
    save_norm(ctx, input, normalized_shape, weight, bias, eps, memory_efficient, output, mean, invvar);
  }

  static Grads backward(AutogradContext& ctx, Grads grads);
};

// RMSNorm: (output, invvar).
struct RmsNormForward {
  static constexpr const char* kSchema =
      "rms_norm_fwd(Tensor input, SymInt[] normalized_shape, Tensor? weight, float eps, "
      "bool memory_efficient=False) -> (Tensor output, Tensor invvar)";

  template <class Device>
  static std::tuple<Tensor, Tensor> call(const Tensor& input, c10::SymIntArrayRef normalized_shape,
                                         const OptionalTensor& weight, double eps, bool /*memory_efficient*/) {
    auto [output, mean, invvar] =
        normalize<Device>("rms_norm_fwd", input, normalized_shape, weight, std::nullopt, eps, /*rms=*/true);
    return {output, invvar};
  }

  static void save(AutogradContext& ctx, const Tensor& input, c10::SymIntArrayRef normalized_shape,
                   const OptionalTensor& weight, double eps, bool memory_efficient,
                   const std::tuple<Tensor, Tensor>& outputs) {
    const auto& [output, invvar] = outputs;
    save_norm(ctx, input, normalized_shape, weight, std::nullopt, eps, memory_efficient, output, Tensor(), invvar);
  }

  static Grads backward(AutogradContext& ctx, Grads grads);
};

// LayerNorm's gradients: (grad_input, grad_weight, grad_bias); grad_input in input_or_output's dtype.
struct LayerNormBackward {
  static constexpr const char* kSchema =
      "layer_norm_bwd(Tensor grad_output, Tensor? mean, Tensor invvar, Tensor input_or_output, "
      "SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps, bool memory_efficient) "
      "-> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)";

  template <class Device>
  static std::tuple<Tensor, Tensor, Tensor> call(const Tensor& grad_output, const OptionalTensor& mean,
                                                 const Tensor& invvar, const Tensor& input_or_output,
                                                 c10::SymIntArrayRef normalized_shape, const OptionalTensor& weight,
                                                 const OptionalTensor& bias, double eps, bool memory_efficient) {
    return differentiate<Device>("layer_norm_bwd", grad_output, mean, invvar, input_or_output, normalized_shape,
                                 weight, bias, eps, memory_efficient, /*rms=*/false);
  }
};

// RMSNorm's gradients: (grad_input, grad_weight).
struct RmsNormBackward {
  static constexpr const char* kSchema =
      "rms_norm_bwd(Tensor grad_output, Tensor invvar, Tensor input_or_output, SymInt[] normalized_shape, "
      "Tensor? weight, float eps, bool memory_efficient) -> (Tensor grad_input, Tensor grad_weight)";

  template <class Device>
  static std::tuple<Tensor, Tensor> call(const Tensor& grad_output, const Tensor& invvar,
                                         const Tensor& input_or_output, c10::SymIntArrayRef normalized_shape,
                                         const OptionalTensor& weight, double eps, bool memory_efficient) {
    auto [grad_input, grad_weight, grad_bias] =
        differentiate<Device>("rms_norm_bwd", grad_output, std::nullopt, invvar, input_or_output, normalized_shape,
                              weight, std::nullopt, eps, memory_efficient, /*rms=*/true);
    return {grad_input, grad_weight};
  }
};

Grads LayerNormForward::backward(AutogradContext& ctx, Grads grads) {
  return norm_grads(ctx, grads, [](auto&&... args) { return call_op<LayerNormBackward>(args...); });
}

Grads RmsNormForward::backward(AutogradContext& ctx, Grads grads) {
  Grads result = norm_grads(ctx, grads, [](const Tensor& dy, const OptionalTensor& /*mean*/, const Tensor& invvar,
                                           const Tensor& kept, c10::SymIntArrayRef shape,
                                           const OptionalTensor& weight, const OptionalTensor& /*bias*/, double eps,
                                           bool memory_efficient) {
    auto [grad_input, grad_weight] = call_op<RmsNormBackward>(dy, invvar, kept, shape, weight, eps, memory_efficient);
    return std::make_tuple(grad_input, grad_weight, Tensor());
  });
  if (result.size() == 4) result.pop_back();  // RMSNorm has no bias: input, shape, weight, eps, memory_efficient
  return result;
}

}  // namespace

// The backward ops have no formula of their own: differentiating through them (double backward) raises.
APEX_LIBRARY(m) {
  define_differentiable<LayerNormForward>(m);
  define_differentiable<RmsNormForward>(m);
  define_first_output<LayerNormForward>(m);  // layer_norm_fwd_output / rms_norm_fwd_output: eager Python calls
  define_first_output<RmsNormForward>(m);
  define<LayerNormBackward>(m);
  define<RmsNormBackward>(m);
}

}  // namespace apex::layer_norm
