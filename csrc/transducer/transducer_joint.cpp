// transducer: the joint ops (schema, checks, outputs, autograd), each declared once; the loss's are
// in transducer_loss.cpp.
#include <ATen/ops/bernoulli.h>

#include "transducer_ops.h"

namespace apex::transducer {

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

APEX_LIBRARY(m) {
  define_differentiable<JointForward>(m);
  define<JointBackward>(m);
}

}  // namespace apex::transducer
