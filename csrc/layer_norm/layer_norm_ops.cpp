// Schemas of the apex::layer_norm_* / apex::rms_norm_* dispatcher ops, and the host-side
// checks every device runs before launching anything.

#include "layer_norm.h"

#include <string>

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

constexpr const char* kOp = "fused_layer_norm: ";

// Error messages are assembled from strings before TORCH_CHECK sees them: c10::str of a single
// std::string skips std::ostringstream, whose inlined integer formatting was seen to crash when
// the extension's compiler ships a different libstdc++ than torch (a device image's /opt/gcc).
template <typename... Parts>
std::string message(const Parts&... parts) {
  std::string out(kOp);
  (out += ... += parts);
  return out;
}

std::string shape(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

const char* name_of(at::ScalarType t) { return c10::toString(t); }

bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// Returns cols = prod(normalized_shape) after checking that it names input's trailing dims.
int64_t check_normalized_shape(const at::Tensor& input, at::IntArrayRef normalized_shape, const char* what) {
  const auto ndim = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(ndim >= 1, message("normalized_shape must name at least one dimension"));
  TORCH_CHECK(input.dim() >= ndim && input.sizes().slice(input.dim() - ndim).equals(normalized_shape),
              message("normalized_shape ", shape(normalized_shape), " must equal the trailing dimensions of ", what,
                      " (shape ", shape(input.sizes()), ")"));
  return c10::multiply_integers(normalized_shape);
}

// weight / bias: same device as input, shape == normalized_shape, dtype `dtype`.
void check_parameter(const std::optional<at::Tensor>& p, const char* name, const at::Tensor& input,
                     at::IntArrayRef normalized_shape, at::ScalarType dtype) {
  if (!p.has_value() || !p->defined()) return;
  TORCH_CHECK(p->device() == input.device(),
              message(name, " is on ", p->device().str(), " but input is on ", input.device().str()));
  TORCH_CHECK(p->sizes().equals(normalized_shape), message(name, " has shape ", shape(p->sizes()),
                                                           " but normalized_shape is ", shape(normalized_shape)));
  TORCH_CHECK(p->scalar_type() == dtype,
              message(name, " has dtype ", name_of(p->scalar_type()), ", expected ", name_of(dtype),
                      " (same as input, or float32 parameters with a half/bfloat16 input)"));
}

// Output dtype rule (NVIDIA apex's forward_affine_mixed_dtypes): weight's dtype when given, which
// must be input's dtype or float32 for half/bfloat16 inputs; else input's dtype.
at::ScalarType output_dtype(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias) {
  const auto& defining = (weight.has_value() && weight->defined()) ? weight : bias;
  if (!defining.has_value() || !defining->defined()) return input.scalar_type();
  const auto w = defining->scalar_type();
  const bool half_input = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  TORCH_CHECK(w == input.scalar_type() || (half_input && w == at::kFloat),
              message("weight/bias dtype ", name_of(w), " is incompatible with input dtype ",
                      name_of(input.scalar_type()),
                      " (use the same dtype, or float32 parameters with a half/bfloat16 input)"));
  return w;
}

at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return (t.has_value() && t->defined()) ? t->contiguous() : at::Tensor();
}

void check_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(is_supported_float(t.scalar_type()),
              message(name, " must be float32, float64, float16 or bfloat16, got ", name_of(t.scalar_type())));
  TORCH_CHECK(t.numel() > 0, message(name, " is empty (shape ", shape(t.sizes()), ")"));
}

void check_statistic(const at::Tensor& s, const char* name, int64_t rows, const at::Tensor& like) {
  TORCH_CHECK(s.device() == like.device(),
              message(name, " is on ", s.device().str(), " but grad_output is on ", like.device().str()));
  TORCH_CHECK(s.numel() == rows, message(name, " has ", std::to_string(s.numel()),
                                         " elements, expected one per row (", std::to_string(rows), ")"));
  TORCH_CHECK(s.scalar_type() == at::kFloat || s.scalar_type() == at::kDouble,
              message(name, " must be float32 or float64, got ", name_of(s.scalar_type())));
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
  TORCH_CHECK(grad_output.sizes().equals(input_or_output.sizes()),
              message("grad_output has shape ", shape(grad_output.sizes()), " but input_or_output has shape ",
                      shape(input_or_output.sizes())));
  TORCH_CHECK(grad_output.device() == input_or_output.device(),
              message("grad_output is on ", grad_output.device().str(), " but input_or_output is on ",
                      input_or_output.device().str()));
  const auto out_dtype = output_dtype(input_or_output, weight, bias);
  // memory_efficient: input_or_output is the forward output, whose dtype already is the output dtype.
  TORCH_CHECK(grad_output.scalar_type() == out_dtype,
              message("grad_output has dtype ", name_of(grad_output.scalar_type()),
                      ", expected the forward output's dtype ", name_of(out_dtype)));
  check_parameter(weight, "weight", input_or_output, normalized_shape, out_dtype);
  check_parameter(bias, "bias", input_or_output, normalized_shape, out_dtype);
  check_statistic(invvar, "invvar", a.rows, grad_output);
  const auto stats = statistics_dtype(input_or_output.scalar_type());
  if (!rms) {
    TORCH_CHECK(mean.has_value() && mean->defined(), message("LayerNorm backward needs mean"));
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
