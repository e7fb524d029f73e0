// xentropy: the ops (schema, argument checks, outputs, autograd), each declared once; apex/op.h
// turns them into torch.ops.apex.xentropy_* with CPU, CUDA and Meta (shape) kernels.
#include "apex/autograd.h"
#include "xentropy.h"

namespace apex::xentropy {
namespace {

// logits [rows, classes] floating, labels [rows] int64 on the same device; returns logits' Dtype.
Dtype check_logits_and_labels(const at::Tensor& logits, const at::Tensor& labels, double smoothing, const char* op) {
  APEX_CHECK(logits.dim() == 2, op, ": logits must be 2-D [rows, classes], got shape ", logits.sym_sizes());
  const Dtype dtype = floating_dtype(logits, op, "logits");
  APEX_CHECK(logits.sym_size(1) > 0, op, ": logits must have at least one class, got shape ", logits.sym_sizes());
  APEX_CHECK(labels.scalar_type() == at::kLong, op, ": labels must be int64, got ", labels.scalar_type());
  APEX_CHECK(labels.dim() == 1 && labels.sym_size(0) == logits.sym_size(0), op, ": labels must have shape [",
             logits.sym_size(0), "] (one per row of logits), got ", labels.sym_sizes());
  check_same_device(labels, logits, op, "labels", "logits");
  APEX_CHECK(smoothing >= 0.0 && smoothing <= 1.0, op, ": smoothing must be in [0, 1], got ", smoothing);
  return dtype;
}

// The kernels' view of real (not meta) logits: unit column stride, any row stride.
LogitsView view_of(const at::Tensor& logits, Dtype dtype) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  return {logits.const_data_ptr(), rows, classes, rows > 1 ? logits.stride(0) : classes, dtype};
}

at::Tensor with_unit_column_stride(const at::Tensor& logits) {
  return logits.size(1) == 1 || logits.stride(1) == 1 ? logits : logits.contiguous();
}

}  // namespace

// grad_logits of xentropy_forward's losses, given their gradient grad_loss [rows] (any float dtype
// and stride; a mean's expanded gradient is read in place).
struct Backward {
  static constexpr const char* kSchema =
      "xentropy_backward(Tensor grad_loss, Tensor logits, Tensor max_log_sum_exp, Tensor labels, "
      "float smoothing=0.0, int ignore_index=-100) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& grad_loss, const at::Tensor& logits, const at::Tensor& max_log_sum_exp,
                         const at::Tensor& labels, double smoothing, int64_t ignore_index) {
    constexpr const char* op = "xentropy_backward";
    const Dtype dtype = check_logits_and_labels(logits, labels, smoothing, op);
    const at::ScalarType stats = statistics_dtype(logits.scalar_type());
    floating_dtype(grad_loss, op, "grad_loss");
    APEX_CHECK(grad_loss.dim() == 1 && grad_loss.sym_size(0) == logits.sym_size(0), op,
               ": grad_loss must have shape [", logits.sym_size(0), "], got ", grad_loss.sym_sizes());
    APEX_CHECK(max_log_sum_exp.scalar_type() == stats && max_log_sum_exp.dim() == 1 &&
                   max_log_sum_exp.sym_size(0) == logits.sym_size(0),
               op, ": max_log_sum_exp must be xentropy_forward's [", logits.sym_size(0), "] ", stats,
               " output, got ", max_log_sum_exp.scalar_type(), " of shape ", max_log_sum_exp.sym_sizes());
    check_same_device(grad_loss, logits, op, "grad_loss", "logits");
    check_same_device(max_log_sum_exp, logits, op, "max_log_sum_exp", "logits");
    at::Tensor grad_logits = at::empty_symint(logits.sym_sizes(), logits.options());
    launch<Device>(logits, [&](const auto& device) {
      const at::Tensor x = with_unit_column_stride(logits), label_ids = labels.contiguous();
      const at::Tensor lse = max_log_sum_exp.contiguous(), grad = grad_loss.to(stats);
      backward(device, BackwardArgs{view_of(x, dtype), label_ids.const_data_ptr<int64_t>(), ignore_index,
                                    smoothing, grad.const_data_ptr(), grad.stride(0),
                                    lse.const_data_ptr(), grad_logits.mutable_data_ptr()});
    });
    return grad_logits;
  }
};

// Per-row losses (float32; float64 for float64 logits) and log-sum-exps of logits [rows, classes];
// differentiable in logits. half_to_float is NVIDIA apex's argument: its losses were float32 either
// way, and so are these.
struct Forward {
  static constexpr const char* kSchema =
      "xentropy_forward(Tensor logits, Tensor labels, float smoothing=0.0, bool half_to_float=False, "
      "int ignore_index=-100) -> (Tensor losses, Tensor max_log_sum_exp)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(const at::Tensor& logits, const at::Tensor& labels, double smoothing,
                                                 bool /*half_to_float*/, int64_t ignore_index) {
    const Dtype dtype = check_logits_and_labels(logits, labels, smoothing, "xentropy_forward");
    const auto stats = logits.options().dtype(statistics_dtype(logits.scalar_type()));
    at::Tensor losses = at::empty_symint({logits.sym_size(0)}, stats);
    at::Tensor max_log_sum_exp = at::empty_symint({logits.sym_size(0)}, stats);
    launch<Device>(logits, [&](const auto& device) {
      const at::Tensor x = with_unit_column_stride(logits), label_ids = labels.contiguous();
      forward(device, ForwardArgs{view_of(x, dtype), label_ids.const_data_ptr<int64_t>(), ignore_index,
                                  smoothing, losses.mutable_data_ptr(),
                                  max_log_sum_exp.mutable_data_ptr()});
    });
    return {losses, max_log_sum_exp};
  }

  static void save(AutogradContext& ctx, const at::Tensor& logits, const at::Tensor& labels, double smoothing,
                   bool /*half_to_float*/, int64_t ignore_index, const std::tuple<at::Tensor, at::Tensor>& outputs) {
    ctx.save_for_backward({logits, std::get<1>(outputs), labels});
    ctx.saved_data["smoothing"] = smoothing;
    ctx.saved_data["ignore_index"] = ignore_index;
    ctx.mark_non_differentiable({std::get<1>(outputs)});
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[0].defined()) return {};
    const auto saved = ctx.get_saved_variables();
    return {call_op<Backward>(grads[0], saved[0], saved[1], saved[2], ctx.saved_data["smoothing"].toDouble(),
                              ctx.saved_data["ignore_index"].toInt())};
  }
};

APEX_LIBRARY(m) {
  define_differentiable<Forward>(m);
  define<Backward>(m);
}

}  // namespace apex::xentropy
