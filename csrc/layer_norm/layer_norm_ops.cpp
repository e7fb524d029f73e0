// Schemas of the apex::layer_norm_* / apex::rms_norm_* dispatcher ops, and the host-side
// checks every device runs before launching anything.

#include "layer_norm.h"

namespace apex::layer_norm {

TORCH_LIBRARY_FRAGMENT(apex, m) {
  // memory_efficient does not change the forward result: it tells the registered autograd
  // formula to keep the output (instead of the input) for the backward.
  m.def("layer_norm_fwd(Tensor input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, "
        "bool memory_efficient=False) -> (Tensor output, Tensor mean, Tensor invvar)");
  m.def("rms_norm_fwd(Tensor input, int[] normalized_shape, Tensor? weight, float eps, "
        "bool memory_efficient=False) -> (Tensor output, Tensor invvar)");
  // grad_weight / grad_bias are empty tensors when weight / bias is None.
  m.def("layer_norm_bwd(Tensor grad_output, Tensor mean, Tensor invvar, Tensor input_or_output, "
        "int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, bool memory_efficient) "
        "-> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");
  m.def("rms_norm_bwd(Tensor grad_output, Tensor invvar, Tensor input_or_output, int[] normalized_shape, "
        "Tensor? weight, float eps, bool memory_efficient) -> (Tensor grad_input, Tensor grad_weight)");
}

at::ScalarType statistics_dtype(at::ScalarType input_dtype) {
  return input_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

namespace {

// Prefix of every error message, so a failure names the op it came from.
constexpr const char* kOp = "fused_layer_norm: ";

bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// Returns cols = prod(normalized_shape) after checking that it names input's trailing dims.
int64_t check_normalized_shape(const at::Tensor& input, at::IntArrayRef normalized_shape, const char* what) {
  const auto ndim = static_cast<int64_t>(normalized_shape.size());
  APEX_CHECK(ndim >= 1, kOp, "normalized_shape must name at least one dimension");
  APEX_CHECK(input.dim() >= ndim && input.sizes().slice(input.dim() - ndim).equals(normalized_shape), kOp,
             "normalized_shape ", normalized_shape, " must equal the trailing dimensions of ", what, " (shape ",
             input.sizes(), ")");
  return c10::multiply_integers(normalized_shape);
}

// weight / bias: same device as input, shape == normalized_shape, dtype `dtype`.
void check_parameter(const std::optional<at::Tensor>& p, const char* name, const at::Tensor& input,
                     at::IntArrayRef normalized_shape, at::ScalarType dtype) {
  if (!p.has_value() || !p->defined()) return;
  APEX_CHECK(p->device() == input.device(), kOp, name, " is on ", p->device(), " but input is on ", input.device());
  APEX_CHECK(p->sizes().equals(normalized_shape), kOp, name, " has shape ", p->sizes(), " but normalized_shape is ",
             normalized_shape);
  APEX_CHECK(p->scalar_type() == dtype, kOp, name, " has dtype ", p->scalar_type(), ", expected ", dtype,
             " (same as input, or float32 parameters with a half/bfloat16 input)");
}

// Output dtype rule (NVIDIA apex's forward_affine_mixed_dtypes): weight's dtype when given, which
// must be input's dtype or float32 for half/bfloat16 inputs; else input's dtype.
at::ScalarType output_dtype(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias) {
  const auto& defining = (weight.has_value() && weight->defined()) ? weight : bias;
  if (!defining.has_value() || !defining->defined()) return input.scalar_type();
  const auto w = defining->scalar_type();
  const bool half_input = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  APEX_CHECK(w == input.scalar_type() || (half_input && w == at::kFloat), kOp, "weight/bias dtype ", w,
             " is incompatible with input dtype ", input.scalar_type(),
             " (use the same dtype, or float32 parameters with a half/bfloat16 input)");
  return w;
}

at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return (t.has_value() && t->defined()) ? t->contiguous() : at::Tensor();
}

void check_input(const at::Tensor& t, const char* name) {
  APEX_CHECK(is_supported_float(t.scalar_type()), kOp, name, " must be float32, float64, float16 or bfloat16, got ",
             t.scalar_type());
  APEX_CHECK(t.numel() > 0, kOp, name, " is empty (shape ", t.sizes(), ")");
}

void check_statistic(const at::Tensor& s, const char* name, int64_t rows, const at::Tensor& like) {
  APEX_CHECK(s.device() == like.device(), kOp, name, " is on ", s.device(), " but grad_output is on ", like.device());
  APEX_CHECK(s.numel() == rows, kOp, name, " has ", s.numel(), " elements, expected one per row (", rows, ")");
  APEX_CHECK(s.scalar_type() == at::kFloat || s.scalar_type() == at::kDouble, kOp, name,
             " must be float32 or float64, got ", s.scalar_type());
}

}  // namespace

ForwardArgs prepare_forward(const at::Tensor& input, at::IntArrayRef normalized_shape,
                            const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                            double eps, bool rms) {
  check_input(input, "input");
  ForwardArgs a;
  a.cols = check_normalized_shape(input, normalized_shape, "input");
  a.rows = input.numel() / a.cols;
  const auto out_dtype = output_dtype(input, weight, bias);
  check_parameter(weight, "weight", input, normalized_shape, out_dtype);
  check_parameter(bias, "bias", input, normalized_shape, out_dtype);
  a.input = input.contiguous();
  a.weight = contiguous_or_undefined(weight);
  a.bias = contiguous_or_undefined(bias);
  a.output = at::empty(input.sizes(), input.options().dtype(out_dtype));
  const auto stats = input.options().dtype(statistics_dtype(input.scalar_type()));
  if (!rms) a.mean = at::empty({a.rows}, stats);
  a.invvar = at::empty({a.rows}, stats);
  a.eps = eps;
  a.rms = rms;
  return a;
}

BackwardArgs prepare_backward(const at::Tensor& grad_output, const std::optional<at::Tensor>& mean,
                              const at::Tensor& invvar, const at::Tensor& input_or_output,
                              at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                              const std::optional<at::Tensor>& bias, double eps, bool rms, bool memory_efficient) {
  check_input(input_or_output, "input_or_output");
  check_input(grad_output, "grad_output");
  BackwardArgs a;
  a.cols = check_normalized_shape(input_or_output, normalized_shape, "input_or_output");
  a.rows = input_or_output.numel() / a.cols;
  APEX_CHECK(grad_output.sizes().equals(input_or_output.sizes()), kOp, "grad_output has shape ", grad_output.sizes(),
             " but input_or_output has shape ", input_or_output.sizes());
  APEX_CHECK(grad_output.device() == input_or_output.device(), kOp, "grad_output is on ", grad_output.device(),
             " but input_or_output is on ", input_or_output.device());
  const auto out_dtype = output_dtype(input_or_output, weight, bias);
  // memory_efficient: input_or_output is the forward output, whose dtype already is the output dtype.
  APEX_CHECK(grad_output.scalar_type() == out_dtype, kOp, "grad_output has dtype ", grad_output.scalar_type(),
             ", expected the forward output's dtype ", out_dtype);
  check_parameter(weight, "weight", input_or_output, normalized_shape, out_dtype);
  check_parameter(bias, "bias", input_or_output, normalized_shape, out_dtype);
  check_statistic(invvar, "invvar", a.rows, grad_output);
  const auto stats = statistics_dtype(input_or_output.scalar_type());
  if (!rms) {
    APEX_CHECK(mean.has_value() && mean->defined(), kOp, "LayerNorm backward needs mean");
    check_statistic(*mean, "mean", a.rows, grad_output);
    a.mean = mean->contiguous().to(stats);
  }
  a.invvar = invvar.contiguous().to(stats);
  a.grad_output = grad_output.contiguous();
  a.input_or_output = input_or_output.contiguous();
  a.weight = contiguous_or_undefined(weight);
  a.bias = contiguous_or_undefined(bias);
  a.grad_input = at::empty(input_or_output.sizes(), input_or_output.options());
  if (a.weight.defined()) a.grad_weight = at::empty(a.weight.sizes(), a.weight.options());
  if (a.bias.defined()) a.grad_bias = at::empty(a.bias.sizes(), a.bias.options());
  a.eps = eps;
  a.rms = rms;
  a.memory_efficient = memory_efficient;
  return a;
}

}  // namespace apex::layer_norm
