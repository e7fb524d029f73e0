// index_mul_2d: the ops (schema, checks, outputs, autograd to second order), each declared once.
#include "apex/autograd.h"
#include "apex/torch_scratch.h"
#include "index_mul_2d.h"

namespace apex::index_mul_2d {
namespace {

// in1 [sources, features], in2 [rows, features] of one floating dtype, idx1 [rows] int64, one device.
Dtype check_inputs(const at::Tensor& in1, const at::Tensor& in2, const at::Tensor& idx1, const char* op) {
  APEX_CHECK(in1.dim() == 2 && in2.dim() == 2, op, ": in1 and in2 must be 2-D, got shapes ", in1.sym_sizes(),
             " and ", in2.sym_sizes());
  const Dtype dtype = floating_dtype(in1, op, "in1");
  APEX_CHECK(in2.scalar_type() == in1.scalar_type(), op, ": in2 must have in1's dtype ", in1.scalar_type(), ", got ",
             in2.scalar_type());
  APEX_CHECK(in1.sym_size(1) == in2.sym_size(1), op, ": in1 and in2 must have as many features (columns), got ",
             in1.sym_sizes(), " and ", in2.sym_sizes());
  APEX_CHECK(idx1.scalar_type() == at::kLong, op, ": idx1 must be int64, got ", idx1.scalar_type());
  APEX_CHECK(idx1.dim() == 1 && idx1.sym_size(0) == in2.sym_size(0), op, ": idx1 must have shape [",
             in2.sym_size(0), "] (one index per row of in2), got ", idx1.sym_sizes());
  check_same_device(in2, in1, op, "in2", "in1");
  check_same_device(idx1, in1, op, "idx1", "in1");
  return dtype;
}

std::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// A tensor like in2 (or in1): same shape, dtype and device.
void check_like(const at::Tensor& t, const at::Tensor& like, const char* op, const char* what, const char* like_what) {
  APEX_CHECK(t.sym_sizes() == like.sym_sizes() && t.scalar_type() == like.scalar_type(), op, ": ", what,
             " must have the shape and dtype of ", like_what, " (", like.sym_sizes(), ", ", like.scalar_type(),
             "), got ", t.sym_sizes(), ", ", t.scalar_type());
  check_same_device(t, like, op, what, like_what);
}

// Runs a pass with everything contiguous; grad_in1 (when given) is zeroed here and receives the
// scattered sums (rows no index names stay zero).
template <class Device>
void run(Pass pass, Dtype dtype, const at::Tensor& in1, const at::Tensor& in2, const at::Tensor& idx1,
         const at::Tensor& grad_out, const std::optional<at::Tensor>& gg1, const std::optional<at::Tensor>& gg2,
         at::Tensor& out, at::Tensor* out2, at::Tensor* grad_in1) {
  launch<Device>(in1, [&](const auto& device) {
    const at::Tensor x1 = in1.contiguous(), x2 = in2.contiguous(), index = idx1.contiguous();
    const at::Tensor g = grad_out.defined() ? grad_out.contiguous() : grad_out;
    const at::Tensor g1 = gg1 && gg1->defined() ? gg1->contiguous() : at::Tensor();
    const at::Tensor g2 = gg2 && gg2->defined() ? gg2->contiguous() : at::Tensor();
    if (grad_in1 != nullptr) grad_in1->zero_();
    const auto pointer = [](const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; };
    at::Tensor scratch;
    index_mul(device, pass,
              Args{in2.size(0), in1.size(0), in1.size(1), dtype, index.const_data_ptr<int64_t>(), x1.const_data_ptr(),
                   x2.const_data_ptr(), pointer(g), pointer(g1), pointer(g2), out.mutable_data_ptr(),
                   out2 != nullptr ? out2->mutable_data_ptr() : nullptr,
                   grad_in1 != nullptr ? grad_in1->mutable_data_ptr() : nullptr},
              torch_scratch(in1, scratch));
  });
}

}  // namespace

// Gradients of index_mul_2d_backward's outputs: (grad_grad_out, grad_in1, grad_in2) from the
// gradients of its grad_in1 and grad_in2 (either may be None: zero).
struct DoubleBackward {
  static constexpr const char* kSchema =
      "index_mul_2d_backward_backward(Tensor? grad_grad_in1, Tensor? grad_grad_in2, Tensor grad_out, Tensor in1, "
      "Tensor in2, Tensor idx1) -> (Tensor grad_grad_out, Tensor grad_in1, Tensor grad_in2)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> call(const std::optional<at::Tensor>& grad_grad_in1,
                                                             const std::optional<at::Tensor>& grad_grad_in2,
                                                             const at::Tensor& grad_out, const at::Tensor& in1,
                                                             const at::Tensor& in2, const at::Tensor& idx1) {
    constexpr const char* op = "index_mul_2d_backward_backward";
    const Dtype dtype = check_inputs(in1, in2, idx1, op);
    check_like(grad_out, in2, op, "grad_out", "in2");
    if (grad_grad_in1 && grad_grad_in1->defined()) check_like(*grad_grad_in1, in1, op, "grad_grad_in1", "in1");
    if (grad_grad_in2 && grad_grad_in2->defined()) check_like(*grad_grad_in2, in2, op, "grad_grad_in2", "in2");
    at::Tensor grad_grad_out = at::empty_symint(in2.sym_sizes(), in2.options());
    at::Tensor grad_in2 = at::empty_symint(in2.sym_sizes(), in2.options());
    at::Tensor grad_in1 = at::empty_symint(in1.sym_sizes(), in1.options());
    run<Device>(Pass::kDoubleBackward, dtype, in1, in2, idx1, grad_out, grad_grad_in1, grad_grad_in2, grad_grad_out,
                &grad_in2, &grad_in1);
    return {grad_grad_out, grad_in1, grad_in2};
  }
};

// (grad_in1, grad_in2) of index_mul_2d given grad_out; differentiable (double backward).
struct Backward {
  static constexpr const char* kSchema =
      "index_mul_2d_backward(Tensor grad_out, Tensor in1, Tensor in2, Tensor idx1) -> (Tensor grad_in1, Tensor grad_in2)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(const at::Tensor& grad_out, const at::Tensor& in1,
                                                 const at::Tensor& in2, const at::Tensor& idx1) {
    constexpr const char* op = "index_mul_2d_backward";
    const Dtype dtype = check_inputs(in1, in2, idx1, op);
    check_like(grad_out, in2, op, "grad_out", "in2");
    at::Tensor grad_in2 = at::empty_symint(in2.sym_sizes(), in2.options());
    at::Tensor grad_in1 = at::empty_symint(in1.sym_sizes(), in1.options());
    run<Device>(Pass::kBackward, dtype, in1, in2, idx1, grad_out, std::nullopt, std::nullopt, grad_in2, nullptr,
                &grad_in1);
    return {grad_in1, grad_in2};
  }

  static void save(AutogradContext& ctx, const at::Tensor& grad_out, const at::Tensor& in1, const at::Tensor& in2,
                   const at::Tensor& idx1, const std::tuple<at::Tensor, at::Tensor>& /*outputs*/) {
    ctx.save_for_backward({grad_out, in1, in2, idx1});
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[0].defined() && !grads[1].defined()) return {};
    const auto saved = ctx.get_saved_variables();
    auto [grad_grad_out, grad_in1, grad_in2] =
        call_op<DoubleBackward>(optional(grads[0]), optional(grads[1]), saved[0], saved[1], saved[2], saved[3]);
    return {grad_grad_out, grad_in1, grad_in2};
  }
};

// in1[idx1] * in2: [rows, features], differentiable to second order in in1 and in2.
struct Forward {
  static constexpr const char* kSchema = "index_mul_2d(Tensor in1, Tensor in2, Tensor idx1) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& in1, const at::Tensor& in2, const at::Tensor& idx1) {
    const Dtype dtype = check_inputs(in1, in2, idx1, "index_mul_2d");
    at::Tensor out = at::empty_symint(in2.sym_sizes(), in2.options());
    run<Device>(Pass::kForward, dtype, in1, in2, idx1, at::Tensor(), std::nullopt, std::nullopt, out, nullptr, nullptr);
    return out;
  }

  static void save(AutogradContext& ctx, const at::Tensor& in1, const at::Tensor& in2, const at::Tensor& idx1,
                   const at::Tensor& /*out*/) {
    ctx.save_for_backward({in1, in2, idx1});
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[0].defined()) return {};
    const auto saved = ctx.get_saved_variables();
    auto [grad_in1, grad_in2] = call_op<Backward>(grads[0], saved[0], saved[1], saved[2]);
    return {grad_in1, grad_in2};
  }
};

APEX_LIBRARY(m) {
  define_differentiable<Forward>(m);
  define_differentiable<Backward>(m);
  define<DoubleBackward>(m);
}

}  // namespace apex::index_mul_2d
