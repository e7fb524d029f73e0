// transducer: the loss ops (schema, checks, outputs, autograd), each declared once; the joint's are
// in transducer_joint.cpp.
#include <ATen/ops/add.h>

#include "transducer_ops.h"

namespace apex::transducer {

// ---- loss ------------------------------------------------------------------------------------

namespace {

struct LossInputs {
  bool packed;
  c10::SymInt batch, max_t, max_u;
};

// x [B, T, U, V] (or packed [rows, V] with batch_offset), label [B, >= U - 1], f_len / y_len [B].
LossInputs check_loss_inputs(const at::Tensor& x, const at::Tensor& label, const at::Tensor& f_len,
                             const at::Tensor& y_len, const std::optional<at::Tensor>& batch_offset, int64_t max_f_len,
                             int64_t blank_idx, const char* op) {
  floating_dtype(x, op, "x");
  const bool packed = defined(batch_offset);
  APEX_CHECK(x.dim() == (packed ? 2 : 4), op, ": x must be ", packed ? "[packed rows, V]" : "[B, T, U, V]",
             ", got shape ", x.sym_sizes());
  APEX_CHECK(label.scalar_type() == at::kInt || label.scalar_type() == at::kLong, op,
             ": label must be int32 or int64, got ", label.scalar_type());
  APEX_CHECK(label.dim() == 2, op, ": label must be [B, max label length], got shape ", label.sym_sizes());
  const c10::SymInt batch = label.sym_size(0);
  const c10::SymInt max_u = packed ? label.sym_size(1) + 1 : x.sym_size(2);
  APEX_CHECK(packed || (x.sym_size(0) == batch && label.sym_size(1) + 1 >= max_u), op,
             ": x [B, T, U, V] needs label [B, >= U - 1], got shapes ", x.sym_sizes(), " and ", label.sym_sizes());
  check_same_device(label, x, op, "label", "x");
  check_lengths(f_len, batch, x, op, "f_len");
  check_lengths(y_len, batch, x, op, "y_len");
  if (packed) check_lengths(*batch_offset, batch, x, op, "batch_offset");
  APEX_CHECK(blank_idx >= 0 && x.sym_size(-1) > blank_idx, op, ": blank_idx must be a class of x (0 to ",
             x.sym_size(-1) - 1, "), got ", blank_idx);
  return {packed, batch, packed ? c10::SymInt(max_f_len) : x.sym_size(1), max_u};
}

// The kernels' view of the loss inputs and statistics (real tensors; `keep` holds converted copies).
LossArgs loss_args(const at::Tensor& x, const at::Tensor& label, const at::Tensor& f_len, const at::Tensor& y_len,
                   const std::optional<at::Tensor>& batch_offset, int64_t max_t, int64_t max_u, int64_t blank_idx,
                   const at::Tensor& alpha, const at::Tensor& beta, const at::Tensor& stats,
                   std::vector<at::Tensor>& keep) {
  const int64_t classes = x.size(-1), rows = x.numel() / std::max<int64_t>(classes, 1);
  keep.push_back(at::add(y_len.to(at::kLong), 1));  // lattice width: label length + 1
  const at::Tensor u_len = keep.back();
  const Lattice lattice = lattice_of(f_len, u_len, batch_offset, max_t, max_u, rows, keep);
  keep.push_back(label.to(at::kLong).contiguous());
  const at::Tensor& labels = keep.back();
  float* s = const_cast<float*>(stats.const_data_ptr<float>());
  return {lattice, classes, floating_dtype(x, "transducer_loss", "x"), x.const_data_ptr(),
          labels.const_data_ptr<int64_t>(), labels.size(1), blank_idx, s, s + rows, s + 2 * rows,
          const_cast<float*>(alpha.const_data_ptr<float>()), const_cast<float*>(beta.const_data_ptr<float>()), nullptr};
}

}  // namespace

// The gradient of transducer_loss_forward's losses in x (fused_softmax) or in log_softmax(x).
struct LossBackward {
  static constexpr const char* kSchema =
      "transducer_loss_backward(Tensor grad_loss, Tensor x, Tensor label, Tensor f_len, Tensor y_len, "
      "Tensor? batch_offset, int max_f_len, int blank_idx, Tensor alpha, Tensor beta, Tensor stats, "
      "bool fused_softmax=True) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& grad_loss, const at::Tensor& x, const at::Tensor& label,
                         const at::Tensor& f_len, const at::Tensor& y_len, const std::optional<at::Tensor>& batch_offset,
                         int64_t max_f_len, int64_t blank_idx, const at::Tensor& alpha, const at::Tensor& beta,
                         const at::Tensor& stats, bool fused_softmax) {
    constexpr const char* op = "transducer_loss_backward";
    const LossInputs in = check_loss_inputs(x, label, f_len, y_len, batch_offset, max_f_len, blank_idx, op);
    APEX_CHECK(grad_loss.dim() == 1 && grad_loss.sym_size(0) == in.batch, op, ": grad_loss must have shape [",
               in.batch, "], got ", grad_loss.sym_sizes());
    floating_dtype(grad_loss, op, "grad_loss");
    for (const auto* t : {&alpha, &beta}) {
      APEX_CHECK(t->scalar_type() == at::kFloat && t->dim() == 3, op,
                 ": alpha and beta must be transducer_loss_forward's float32 [B, T, U] outputs, got ",
                 t->scalar_type(), " of shape ", t->sym_sizes());
    }
    APEX_CHECK(stats.scalar_type() == at::kFloat && stats.dim() == 2 && stats.sym_size(0) == 3, op,
               ": stats must be transducer_loss_forward's float32 [3, rows] output, got ", stats.sym_sizes());
    at::Tensor grad = at::empty_symint(x.sym_sizes(), x.options());
    launch<Device>(x, [&](const auto& device) {
      std::vector<at::Tensor> keep;
      const at::Tensor logits = x.contiguous(), g = grad_loss.to(at::kFloat).contiguous();
      const LossArgs a = loss_args(logits, label, f_len, y_len, batch_offset, alpha.size(1), alpha.size(2), blank_idx,
                                   alpha.contiguous(), beta.contiguous(), stats.contiguous(), keep);
      loss_backward(device, LossBackwardArgs{a, g.const_data_ptr<float>(), fused_softmax, grad.mutable_data_ptr()});
    });
    return grad;
  }
};

// Per-sequence RNN-T losses ([B], x's dtype) of logits x, with alpha, beta ([B, T, U] float32) and
// the per-row statistics the backward reads; differentiable in x.
struct LossForward {
  static constexpr const char* kSchema =
      "transducer_loss_forward(Tensor x, Tensor label, Tensor f_len, Tensor y_len, Tensor? batch_offset, "
      "int max_f_len, int blank_idx) -> (Tensor loss, Tensor alpha, Tensor beta, Tensor stats)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call(
      const at::Tensor& x, const at::Tensor& label, const at::Tensor& f_len, const at::Tensor& y_len,
      const std::optional<at::Tensor>& batch_offset, int64_t max_f_len, int64_t blank_idx) {
    const LossInputs in =
        check_loss_inputs(x, label, f_len, y_len, batch_offset, max_f_len, blank_idx, "transducer_loss_forward");
    const auto floats = x.options().dtype(at::kFloat);
    at::Tensor loss = at::empty_symint({in.batch}, x.options());
    at::Tensor alpha = at::empty_symint({in.batch, in.max_t, in.max_u}, floats);
    at::Tensor beta = at::empty_symint({in.batch, in.max_t, in.max_u}, floats);
    const c10::SymInt rows = x.sym_numel() / x.sym_size(-1);
    at::Tensor stats = at::empty_symint({c10::SymInt(3), rows}, floats);
    launch<Device>(x, [&](const auto& device) {
      std::vector<at::Tensor> keep;
      alpha.zero_();  // cells past the lengths stay 0
      beta.zero_();
      const at::Tensor logits = x.contiguous();
      LossArgs a = loss_args(logits, label, f_len, y_len, batch_offset, alpha.size(1), alpha.size(2), blank_idx, alpha,
                             beta, stats, keep);
      a.loss = loss.mutable_data_ptr();
      loss_forward(device, a);
    });
    return {loss, alpha, beta, stats};
  }

  static void save(AutogradContext& ctx, const at::Tensor& x, const at::Tensor& label, const at::Tensor& f_len,
                   const at::Tensor& y_len, const std::optional<at::Tensor>& batch_offset, int64_t max_f_len,
                   int64_t blank_idx, const std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>& outputs) {
    const auto& [loss, alpha, beta, stats] = outputs;
    ctx.save_for_backward({x, label, f_len, y_len, batch_offset.value_or(at::Tensor()), alpha, beta, stats});
    ctx.saved_data["max_f_len"] = max_f_len;
    ctx.saved_data["blank_idx"] = blank_idx;
    ctx.mark_non_differentiable({alpha, beta, stats});
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[0].defined()) return {};
    const auto s = ctx.get_saved_variables();
    const auto offset = s[4].defined() ? std::optional<at::Tensor>(s[4]) : std::nullopt;
    return {call_op<LossBackward>(grads[0], s[0], s[1], s[2], s[3], offset, ctx.saved_data["max_f_len"].toInt(),
                                  ctx.saved_data["blank_idx"].toInt(), s[5], s[6], s[7], true)};
  }
};

APEX_LIBRARY(m) {
  define_differentiable<LossForward>(m);
  define<LossBackward>(m);
}

}  // namespace apex::transducer
