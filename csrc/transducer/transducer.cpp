// transducer: the joint and loss ops (schema, checks, outputs, autograd), each declared once.
#include <ATen/ops/add.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/zeros.h>

#include "apex/autograd.h"
#include "transducer.h"

namespace apex::transducer {
namespace {

bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// lengths / offsets: [B] integer tensors on `like`'s device.
void check_lengths(const at::Tensor& t, const c10::SymInt& batch, const at::Tensor& like, const char* op,
                   const char* what) {
  APEX_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", what,
             " must be int32 or int64, got ", t.scalar_type());
  APEX_CHECK(t.dim() == 1 && t.sym_size(0) == batch, op, ": ", what, " must have shape [", batch, "], got ",
             t.sym_sizes());
  check_same_device(t, like, op, what, "the data");
}

// The kernels' lattice over real tensors; `keep` holds the int64 copies the pointers refer to.
Lattice lattice_of(const at::Tensor& t_len, const at::Tensor& u_len, const std::optional<at::Tensor>& batch_offset,
                   int64_t max_t, int64_t max_u, int64_t rows, std::vector<at::Tensor>& keep) {
  const auto as_long = [&](const at::Tensor& t) {
    keep.push_back(t.to(at::kLong).contiguous());
    return keep.back().const_data_ptr<int64_t>();
  };
  const int64_t* offsets = defined(batch_offset) ? as_long(*batch_offset) : nullptr;
  return {t_len.size(0), max_t, max_u, as_long(t_len), as_long(u_len), offsets, rows};
}

}  // namespace

// ---- joint -----------------------------------------------------------------------------------

// (f_grad [B, max_f_len, H], g_grad [B, max_g_len, H]) of transducer_joint_forward's h. The ReLU (and
// dropout) mask is the forward's stored mask, or, for a ReLU whose mask was not stored, recomputed
// from the forward's inputs relu_f [B, max_f_len, H] and relu_g [B, max_g_len, H].
struct JointBackward {
  static constexpr const char* kSchema =
      "transducer_joint_backward(Tensor h_grad, Tensor? mask, Tensor f_len, Tensor g_len, Tensor? batch_offset, "
      "SymInt max_f_len, SymInt max_g_len, float scale=1.0, Tensor? relu_f=None, Tensor? relu_g=None) "
      "-> (Tensor f_grad, Tensor g_grad)";

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(const at::Tensor& h_grad, const std::optional<at::Tensor>& mask,
                                                 const at::Tensor& f_len, const at::Tensor& g_len,
                                                 const std::optional<at::Tensor>& batch_offset, c10::SymInt max_f_len,
                                                 c10::SymInt max_g_len, double scale,
                                                 const std::optional<at::Tensor>& relu_f,
                                                 const std::optional<at::Tensor>& relu_g) {
    constexpr const char* op = "transducer_joint_backward";
    const Dtype dtype = floating_dtype(h_grad, op, "h_grad");
    const bool packed = defined(batch_offset);
    APEX_CHECK(h_grad.dim() == (packed ? 2 : 4), op, ": h_grad must be ", packed ? "[packed_batch, H]" : "[B, T, U, H]",
               ", got shape ", h_grad.sym_sizes());
    const c10::SymInt batch = f_len.sym_size(0);
    check_lengths(f_len, batch, h_grad, op, "f_len");
    check_lengths(g_len, batch, h_grad, op, "g_len");
    if (packed) check_lengths(*batch_offset, batch, h_grad, op, "batch_offset");
    if (defined(mask)) {
      APEX_CHECK(mask->scalar_type() == at::kByte && mask->sym_sizes() == h_grad.sym_sizes(), op,
                 ": mask must be uint8 of h_grad's shape, got ", mask->scalar_type(), " of shape ", mask->sym_sizes());
    }
    const c10::SymInt width = h_grad.sym_size(-1);
    const bool relu = defined(relu_f);
    APEX_CHECK(relu == defined(relu_g), op, ": relu_f and relu_g come together");
    APEX_CHECK(!(relu && defined(mask)), op, ": give either mask or relu_f and relu_g, not both");
    if (relu) {
      for (const auto& [t, name, steps] :
           {std::tuple(&*relu_f, "relu_f", max_f_len), std::tuple(&*relu_g, "relu_g", max_g_len)}) {
        APEX_CHECK(t->scalar_type() == h_grad.scalar_type(), op, ": ", name, " must have h_grad's dtype ",
                   h_grad.scalar_type(), ", got ", t->scalar_type());
        APEX_CHECK(t->dim() == 3 && t->sym_size(0) == batch && t->sym_size(1) == steps && t->sym_size(2) == width, op,
                   ": ", name, " must have shape [", batch, ", ", steps, ", ", width, "], got ", t->sym_sizes());
        check_same_device(*t, h_grad, op, name, "h_grad");
      }
    }
    at::Tensor f_grad = at::empty_symint({batch, max_f_len, width}, h_grad.options());
    at::Tensor g_grad = at::empty_symint({batch, max_g_len, width}, h_grad.options());
    launch<Device>(h_grad, [&](const auto& device) {
      std::vector<at::Tensor> keep;
      const at::Tensor grad = h_grad.contiguous();
      const at::Tensor m = defined(mask) ? mask->contiguous() : at::Tensor();
      const at::Tensor f = relu ? relu_f->contiguous() : at::Tensor(), g = relu ? relu_g->contiguous() : at::Tensor();
      const int64_t rows = grad.numel() / std::max<int64_t>(1, grad.size(-1));
      const Lattice lattice = lattice_of(f_len, g_len, batch_offset, f_grad.size(1), g_grad.size(1), rows, keep);
      JointBackwardArgs args{lattice, grad.size(-1), dtype, grad.const_data_ptr(),
                             m.defined() ? m.const_data_ptr<uint8_t>() : nullptr, static_cast<float>(scale),
                             f_grad.mutable_data_ptr(), g_grad.mutable_data_ptr(), nullptr,
                             relu ? f.const_data_ptr() : nullptr, relu ? g.const_data_ptr() : nullptr};
      const int64_t scratch = joint_backward_workspace(device, args);
      const at::Tensor workspace = scratch > 0 ? at::empty({scratch}, grad.options().dtype(at::kFloat)) : at::Tensor();
      if (scratch > 0) args.workspace = workspace.mutable_data_ptr<float>();
      joint_backward(device, args);
    });
    return {f_grad, g_grad};
  }
};

// h = f[b, t] + g[b, u] over the lattice ([B, T, U, H], or [packed_batch, H] when batch_offset is
// given), then ReLU and dropout; mask (uint8, h's shape) marks what passed both, empty when neither
// applies. return_mask=False with ReLU and no dropout: mask comes back empty, unwritten (a third of
// the forward's bytes), and the backward recomputes it from f and g (saved instead: [B, T, H] and
// [B, U, H], a fraction of the mask's [rows, H]). Dropout's mask is always written: it is random.
// Differentiable in f and g.
struct JointForward {
  static constexpr const char* kSchema =
      "transducer_joint_forward(Tensor f, Tensor g, Tensor f_len, Tensor g_len, Tensor? batch_offset, "
      "int packed_batch=0, bool relu=False, float dropout_prob=0.0, bool return_mask=True) -> (Tensor h, Tensor mask)";

  // Whether the forward writes the mask; else, with relu, the backward recomputes it.
  static bool writes_mask(bool relu, double dropout_prob, bool return_mask) {
    return dropout_prob > 0.0 || (relu && return_mask);
  }

  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(const at::Tensor& f, const at::Tensor& g, const at::Tensor& f_len,
                                                 const at::Tensor& g_len, const std::optional<at::Tensor>& batch_offset,
                                                 int64_t packed_batch, bool relu, double dropout_prob,
                                                 bool return_mask) {
    constexpr const char* op = "transducer_joint_forward";
    const Dtype dtype = floating_dtype(f, op, "f");
    APEX_CHECK(f.dim() == 3 && g.dim() == 3 && f.sym_size(0) == g.sym_size(0) && f.sym_size(2) == g.sym_size(2), op,
               ": f must be [B, T, H] and g [B, U, H], got shapes ", f.sym_sizes(), " and ", g.sym_sizes());
    APEX_CHECK(g.scalar_type() == f.scalar_type(), op, ": g must have f's dtype ", f.scalar_type(), ", got ",
               g.scalar_type());
    check_same_device(g, f, op, "g", "f");
    APEX_CHECK(dropout_prob >= 0.0 && dropout_prob < 1.0, op, ": dropout_prob must be in [0, 1), got ", dropout_prob);
    const c10::SymInt batch = f.sym_size(0);
    check_lengths(f_len, batch, f, op, "f_len");
    check_lengths(g_len, batch, f, op, "g_len");
    const bool packed = defined(batch_offset);
    if (packed) {
      check_lengths(*batch_offset, batch, f, op, "batch_offset");
      APEX_CHECK(packed_batch >= 0, op, ": packed_batch must be the packed row count, got ", packed_batch);
    }
    const c10::SymInt width = f.sym_size(2);
    at::Tensor h = packed ? at::empty_symint({c10::SymInt(packed_batch), width}, f.options())
                          : at::empty_symint({batch, f.sym_size(1), g.sym_size(1), width}, f.options());
    const bool masked = writes_mask(relu, dropout_prob, return_mask);
    at::Tensor mask = masked ? at::empty_symint(h.sym_sizes(), f.options().dtype(at::kByte))
                             : at::empty({0}, f.options().dtype(at::kByte));
    launch<Device>(f, [&](const auto& device) {
      std::vector<at::Tensor> keep_alive;
      const at::Tensor fc = f.contiguous(), gc = g.contiguous();
      const at::Tensor keep = dropout_prob > 0.0 ? at::bernoulli(at::empty(h.sizes(), f.options().dtype(at::kFloat)),
                                                                 1.0 - dropout_prob).to(at::kBool)
                                                 : at::Tensor();
      const int64_t rows = h.numel() / std::max<int64_t>(1, f.size(2));
      const Lattice lattice = lattice_of(f_len, g_len, batch_offset, f.size(1), g.size(1), rows, keep_alive);
      joint_forward(device, JointArgs{lattice, f.size(2), dtype, fc.const_data_ptr(), gc.const_data_ptr(), relu,
                                      keep.defined() ? keep.const_data_ptr<bool>() : nullptr,
                                      static_cast<float>(1.0 / (1.0 - dropout_prob)), h.mutable_data_ptr(),
                                      masked ? mask.mutable_data_ptr<uint8_t>() : nullptr});
    });
    return {h, mask};
  }

  static void save(AutogradContext& ctx, const at::Tensor& f, const at::Tensor& g, const at::Tensor& f_len,
                   const at::Tensor& g_len, const std::optional<at::Tensor>& batch_offset, int64_t /*packed_batch*/,
                   bool relu, double dropout_prob, bool return_mask,
                   const std::tuple<at::Tensor, at::Tensor>& outputs) {
    const bool masked = writes_mask(relu, dropout_prob, return_mask), recompute = relu && !masked;
    ctx.save_for_backward({f_len, g_len, batch_offset.value_or(at::Tensor()),
                           masked ? std::get<1>(outputs) : at::Tensor(), recompute ? f : at::Tensor(),
                           recompute ? g : at::Tensor()});
    ctx.saved_data["max_f_len"] = f.sym_size(1);
    ctx.saved_data["max_g_len"] = g.sym_size(1);
    ctx.saved_data["scale"] = dropout_prob > 0.0 ? 1.0 / (1.0 - dropout_prob) : 1.0;
    ctx.mark_non_differentiable({std::get<1>(outputs)});
    ctx.set_materialize_grads(false);
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    if (!grads[0].defined()) return {};
    const auto saved = ctx.get_saved_variables();
    const auto optional = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
    auto [f_grad, g_grad] = call_op<JointBackward>(grads[0], optional(saved[3]), saved[0], saved[1], optional(saved[2]),
                                                   ctx.saved_data["max_f_len"].toSymInt(),
                                                   ctx.saved_data["max_g_len"].toSymInt(),
                                                   ctx.saved_data["scale"].toDouble(), optional(saved[4]),
                                                   optional(saved[5]));
    return {f_grad, g_grad};
  }
};

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
  define_differentiable<JointForward>(m);
  define<JointBackward>(m);
  define_differentiable<LossForward>(m);
  define<LossBackward>(m);
}

}  // namespace apex::transducer
