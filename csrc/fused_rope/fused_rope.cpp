// fused_rotary_positional_embedding: the ops (schema, argument checks, outputs, autograd), each
// declared once; apex/op.h turns them into torch.ops.apex.fused_rope_* with CPU, CUDA and Meta
// kernels. The historical module fused_rotary_positional_embedding is their face:
//
//   forward / backward(t, freqs, transpose_output)              t [s, b, h, d], freqs [s, 1, 1, d2]
//   forward_cached / backward_cached(t, cos, sin, transpose_output)     cos, sin [s, 1, 1, d2]
//   forward_thd / backward_thd(t, cu_seqlens, freqs)            t [total, h, d], freqs [max_s, 1, 1, d2]
//   forward_2d / backward_2d(t, cos_h, sin_h, cos_w, sin_w)     t [b, ih, iw, h, d] -> [b, ih * iw, h, d]
//
// Beyond upstream: any strides (a bshd tensor is its sbhd transpose; nothing is copied), tables in
// float32 or the data's dtype, `interleaved` (GPT-J pairs), per-sequence `start_positions`, and a
// table longer than the sequence. The forward ops are differentiable in t.
#include "apex/autograd.h"
#include "fused_rope.h"

namespace apex::fused_rope {
namespace {

// A table [rows, 1, 1, width] (or [1, rows, 1, width] for 2-D) of float32 or the data's dtype.
void check_table(const at::Tensor& table, const at::Tensor& t, int64_t position_dim, const char* op, const char* what) {
  APEX_CHECK(table.dim() == 4, op, ": ", what, " must be 4-D, got shape ", table.sym_sizes());
  for (int64_t d = 0; d < 3; ++d) {
    APEX_CHECK(d == position_dim || table.sym_size(d) == 1, op, ": ", what, " must have shape ",
               position_dim == 0 ? "[positions, 1, 1, rotary dims]" : "[1, positions, 1, d / 2]", ", got ",
               table.sym_sizes());
  }
  APEX_CHECK(table.scalar_type() == at::kFloat || table.scalar_type() == t.scalar_type(), op, ": ", what,
             " must be float32 or ", t.scalar_type(), " (the input's dtype), got ", table.scalar_type());
  check_same_device(table, t, op, what, "the input");
}

void check_same_table(const at::Tensor& sin, const at::Tensor& cos, const char* op, const char* sin_name,
                      const char* cos_name) {
  APEX_CHECK(sin.sym_sizes() == cos.sym_sizes() && sin.scalar_type() == cos.scalar_type(), op, ": ", sin_name,
             " must match ", cos_name, " (", cos.scalar_type(), ", shape ", cos.sym_sizes(), "), got ",
             sin.scalar_type(), " of shape ", sin.sym_sizes());
}

// The rotated dims of a 1-D table on input t with head dim d.
void check_rotary_dims(const at::Tensor& table, const at::Tensor& t, const char* op, const char* what) {
  const c10::SymInt d2 = table.sym_size(3);
  APEX_CHECK(d2 <= t.sym_size(-1) && d2 % 2 == 0, op, ": ", what, "'s last dimension (the rotated dims, ", d2,
             ") must be even and at most the head dim ", t.sym_size(-1));
}

// The kernel's view of a table tensor: positions along `position_dim`, unit element stride.
Table table_view(const at::Tensor& cos_or_angles, const at::Tensor* sin, int64_t position_dim, Dtype data_dtype,
                 std::vector<at::Tensor>& keep_alive) {
  const auto unit_stride = [&](const at::Tensor& t) {
    keep_alive.push_back(t.size(3) <= 1 || t.stride(3) == 1 ? t : t.contiguous());
    return keep_alive.back();
  };
  const at::Tensor c = unit_stride(cos_or_angles);
  const at::Tensor s = sin != nullptr ? unit_stride(*sin) : at::Tensor();
  return {c.const_data_ptr(), sin != nullptr ? s.const_data_ptr() : nullptr,
          c.scalar_type() == at::kFloat ? Dtype::kFloat32 : data_dtype,
          c.size(position_dim) > 1 ? c.stride(position_dim) : 0, c.size(position_dim)};
}

// An output shaped like `sizes` ([s, b, h, d]), laid out [b, s, h, d] when transpose_output (so
// that out.transpose(0, 1) is contiguous).
at::Tensor sbhd_output(c10::SymIntArrayRef sizes, const at::TensorOptions& options, bool transpose_output) {
  if (!transpose_output) return at::empty_symint(sizes, options);
  return at::empty_symint({sizes[1], sizes[0], sizes[2], sizes[3]}, options).transpose(0, 1);
}

// What every layout's op function fills in before running the kernel on real tensors.
RopeArgs base_args(const at::Tensor& x, const at::Tensor& out, Dtype dtype, bool interleaved, bool backward) {
  RopeArgs a{};
  a.x = x.const_data_ptr();
  a.out = out.mutable_data_ptr();
  a.dtype = dtype;
  a.heads = x.size(-2);
  a.dim = x.size(-1);
  a.x_stride_h = x.stride(-2);
  a.x_stride_d = x.stride(-1);
  a.out_stride_h = out.stride(-2);
  a.interleaved = interleaved;
  a.backward = backward;
  a.sections = 1;
  return a;
}

// ---- sbhd (bshd as its transpose), angles or cached cos/sin ---------------------------------------

template <class Device>
at::Tensor sbhd(const char* op, const at::Tensor& t, const at::Tensor& cos_or_freqs, const at::Tensor* sin,
                bool transpose_output, bool interleaved, const std::optional<at::Tensor>& start_positions,
                bool backward) {
  const Dtype dtype = floating_dtype(t, op, "input", /*allow_double=*/false);
  APEX_CHECK(t.dim() == 4, op, ": input must be 4-D [s, b, h, d] (a bshd tensor transposed), got shape ",
             t.sym_sizes());
  const char* table_name = sin != nullptr ? "cos" : "freqs";
  check_table(cos_or_freqs, t, 0, op, table_name);
  if (sin != nullptr) check_same_table(*sin, cos_or_freqs, op, "sin", "cos");
  check_rotary_dims(cos_or_freqs, t, op, table_name);
  const bool offsets = start_positions.has_value() && start_positions->defined();
  if (offsets) {
    APEX_CHECK(start_positions->dim() == 1 && start_positions->sym_size(0) == t.sym_size(1) &&
                   (start_positions->scalar_type() == at::kInt || start_positions->scalar_type() == at::kLong),
               op, ": start_positions must be int32 or int64 of shape [", t.sym_size(1), "] (one per sequence), got ",
               start_positions->scalar_type(), " of shape ", start_positions->sym_sizes());
    check_same_device(*start_positions, t, op, "start_positions", "the input");
  } else {
    APEX_CHECK(cos_or_freqs.sym_size(0) >= t.sym_size(0), op, ": ", table_name, " has ", cos_or_freqs.sym_size(0),
               " positions but the input has s = ", t.sym_size(0));
  }
  at::Tensor out = sbhd_output(t.sym_sizes(), t.options(), transpose_output);
  launch<Device>(t, [&](const auto& device) {
    std::vector<at::Tensor> keep_alive;
    RopeArgs a = base_args(t, out, dtype, interleaved, backward);
    a.outer0 = t.size(0);
    a.outer1 = t.size(1);
    a.x_stride0 = t.stride(0);
    a.x_stride1 = t.stride(1);
    a.out_stride0 = out.stride(0);
    a.out_stride1 = out.stride(1);
    a.positions = Positions::kSequence;
    if (offsets) {
      keep_alive.push_back(start_positions->to(at::kLong).contiguous());
      a.offsets = keep_alive.back().const_data_ptr<int64_t>();
    }
    a.tables[0] = table_view(cos_or_freqs, sin, 0, dtype, keep_alive);
    a.width = cos_or_freqs.size(3);
    rope(device, a);
  });
  return out;
}

// ---- thd: packed sequences ------------------------------------------------------------------

template <class Device>
at::Tensor thd(const char* op, const at::Tensor& t, const at::Tensor& cu_seqlens, const at::Tensor& freqs,
               bool interleaved, bool backward) {
  const Dtype dtype = floating_dtype(t, op, "input", /*allow_double=*/false);
  APEX_CHECK(t.dim() == 3, op, ": input must be 3-D [total tokens, h, d], got shape ", t.sym_sizes());
  APEX_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.sym_size(0) >= 1 &&
                 (cu_seqlens.scalar_type() == at::kInt || cu_seqlens.scalar_type() == at::kLong),
             op, ": cu_seqlens must be int32 [sequences + 1] (cumulative sequence lengths), got ",
             cu_seqlens.scalar_type(), " of shape ", cu_seqlens.sym_sizes());
  check_same_device(cu_seqlens, t, op, "cu_seqlens", "the input");
  check_table(freqs, t, 0, op, "freqs");
  check_rotary_dims(freqs, t, op, "freqs");
  at::Tensor out = at::empty_symint(t.sym_sizes(), t.options());
  launch<Device>(t, [&](const auto& device) {
    std::vector<at::Tensor> keep_alive;
    RopeArgs a = base_args(t, out, dtype, interleaved, backward);
    a.outer0 = t.size(0);
    a.outer1 = 1;
    a.x_stride0 = t.stride(0);
    a.out_stride0 = out.stride(0);
    a.positions = Positions::kPacked;
    keep_alive.push_back(cu_seqlens.to(at::kInt).contiguous());
    a.cu_seqlens = keep_alive.back().const_data_ptr<int32_t>();
    a.sequences = cu_seqlens.size(0) - 1;
    a.tables[0] = table_view(freqs, nullptr, 0, dtype, keep_alive);
    a.width = freqs.size(3);
    rope(device, a);
  });
  return out;
}

// ---- 2-D: images, rows in the first half of each head, columns in the second ------------------

template <class Device>
at::Tensor image(const char* op, const at::Tensor& t, const at::Tensor& cos_h, const at::Tensor& sin_h,
                 const at::Tensor& cos_w, const at::Tensor& sin_w, bool backward) {
  const Dtype dtype = floating_dtype(t, op, "input", /*allow_double=*/false);
  APEX_CHECK(t.dim() == 5, op, ": input must be 5-D [b, ih, iw, h, d], got shape ", t.sym_sizes());
  APEX_CHECK(t.sym_size(4) % 4 == 0, op, ": the head dim must be a multiple of 4 (each half rotates in pairs), got ",
             t.sym_size(4));
  check_table(cos_h, t, 1, op, "cos_h");
  check_table(cos_w, t, 1, op, "cos_w");
  check_same_table(sin_h, cos_h, op, "sin_h", "cos_h");
  check_same_table(sin_w, cos_w, op, "sin_w", "cos_w");
  for (const auto& [table, name, extent] : {std::tuple{&cos_h, "cos_h", t.sym_size(1)},
                                            std::tuple{&cos_w, "cos_w", t.sym_size(2)}}) {
    APEX_CHECK(table->sym_size(3) * 2 == t.sym_size(4) && table->sym_size(1) >= extent, op, ": ", name,
               " must have shape [1, >= ", extent, ", 1, ", t.sym_size(4) / 2, "] for input of shape ", t.sym_sizes(),
               ", got ", table->sym_sizes());
  }
  at::Tensor out = at::empty_symint({t.sym_size(0), t.sym_size(1) * t.sym_size(2), t.sym_size(3), t.sym_size(4)},
                                    t.options());
  launch<Device>(t, [&](const auto& device) {
    std::vector<at::Tensor> keep_alive;
    // [b, ih, iw, h, d] as [b, ih * iw, h, d]: a view whenever the input came from one (it does).
    keep_alive.push_back(t.reshape({t.size(0), t.size(1) * t.size(2), t.size(3), t.size(4)}));
    const at::Tensor& x = keep_alive.back();
    RopeArgs a = base_args(x, out, dtype, /*interleaved=*/false, backward);
    a.outer0 = x.size(0);
    a.outer1 = x.size(1);
    a.x_stride0 = x.stride(0);
    a.x_stride1 = x.stride(1);
    a.out_stride0 = out.stride(0);
    a.out_stride1 = out.stride(1);
    a.positions = Positions::kImage;
    a.image_width = t.size(2);
    a.tables[0] = table_view(cos_h, &sin_h, 1, dtype, keep_alive);
    a.tables[1] = table_view(cos_w, &sin_w, 1, dtype, keep_alive);
    a.sections = 2;
    a.width = t.size(4) / 2;
    rope(device, a);
  });
  return out;
}

constexpr const char* kForwardName = "fused_rope_forward";
constexpr const char* kBackwardName = "fused_rope_backward";
constexpr const char* kForwardCachedName = "fused_rope_forward_cached";
constexpr const char* kBackwardCachedName = "fused_rope_backward_cached";
constexpr const char* kForwardThdName = "fused_rope_forward_thd";
constexpr const char* kBackwardThdName = "fused_rope_backward_thd";
constexpr const char* kForward2dName = "fused_rope_forward_2d";
constexpr const char* kBackward2dName = "fused_rope_backward_2d";

}  // namespace

// ---- the ops ------------------------------------------------------------------------------------

struct Backward {
  static constexpr const char* kSchema =
      "fused_rope_backward(Tensor output_grads, Tensor freqs, bool transpose_output=False, *, "
      "bool interleaved=False, Tensor? start_positions=None) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& grads, const at::Tensor& freqs, bool transpose_output, bool interleaved,
                         const std::optional<at::Tensor>& start_positions) {
    return sbhd<Device>(kBackwardName, grads, freqs, nullptr, transpose_output, interleaved, start_positions, true);
  }
};

// RoPE of t [s, b, h, d] with angles freqs [>= s, 1, 1, d2] (float32 or t's dtype); out [s, b, h, d],
// laid out bshd when transpose_output.
struct Forward {
  static constexpr const char* kSchema =
      "fused_rope_forward(Tensor t, Tensor freqs, bool transpose_output=False, *, bool interleaved=False, "
      "Tensor? start_positions=None) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& t, const at::Tensor& freqs, bool transpose_output, bool interleaved,
                         const std::optional<at::Tensor>& start_positions) {
    return sbhd<Device>(kForwardName, t, freqs, nullptr, transpose_output, interleaved, start_positions, false);
  }

  static void save(AutogradContext& ctx, const at::Tensor&, const at::Tensor& freqs, bool transpose_output,
                   bool interleaved, const std::optional<at::Tensor>& start_positions, const at::Tensor&) {
    ctx.save_for_backward({freqs, start_positions.value_or(at::Tensor())});
    ctx.saved_data["transpose_output"] = transpose_output;
    ctx.saved_data["interleaved"] = interleaved;
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    const auto saved = ctx.get_saved_variables();
    return {call_op<Backward>(grads[0], saved[0], ctx.saved_data["transpose_output"].toBool(),
                              ctx.saved_data["interleaved"].toBool(),
                              saved[1].defined() ? std::optional(saved[1]) : std::nullopt)};
  }
};

struct BackwardCached {
  static constexpr const char* kSchema =
      "fused_rope_backward_cached(Tensor output_grads, Tensor cos, Tensor sin, bool transpose_output=False, *, "
      "bool interleaved=False, Tensor? start_positions=None) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& grads, const at::Tensor& cos, const at::Tensor& sin, bool transpose_output,
                         bool interleaved, const std::optional<at::Tensor>& start_positions) {
    return sbhd<Device>(kBackwardCachedName, grads, cos, &sin, transpose_output, interleaved, start_positions, true);
  }
};

// RoPE of t [s, b, h, d] with precomputed cos, sin [>= s, 1, 1, d2].
struct ForwardCached {
  static constexpr const char* kSchema =
      "fused_rope_forward_cached(Tensor t, Tensor cos, Tensor sin, bool transpose_output=False, *, "
      "bool interleaved=False, Tensor? start_positions=None) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin, bool transpose_output,
                         bool interleaved, const std::optional<at::Tensor>& start_positions) {
    return sbhd<Device>(kForwardCachedName, t, cos, &sin, transpose_output, interleaved, start_positions, false);
  }

  static void save(AutogradContext& ctx, const at::Tensor&, const at::Tensor& cos, const at::Tensor& sin,
                   bool transpose_output, bool interleaved, const std::optional<at::Tensor>& start_positions,
                   const at::Tensor&) {
    ctx.save_for_backward({cos, sin, start_positions.value_or(at::Tensor())});
    ctx.saved_data["transpose_output"] = transpose_output;
    ctx.saved_data["interleaved"] = interleaved;
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    const auto saved = ctx.get_saved_variables();
    return {call_op<BackwardCached>(grads[0], saved[0], saved[1], ctx.saved_data["transpose_output"].toBool(),
                                    ctx.saved_data["interleaved"].toBool(),
                                    saved[2].defined() ? std::optional(saved[2]) : std::nullopt)};
  }
};

struct BackwardThd {
  static constexpr const char* kSchema =
      "fused_rope_backward_thd(Tensor output_grads, Tensor cu_seqlens, Tensor freqs, *, bool interleaved=False) -> "
      "Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& grads, const at::Tensor& cu_seqlens, const at::Tensor& freqs,
                         bool interleaved) {
    return thd<Device>(kBackwardThdName, grads, cu_seqlens, freqs, interleaved, true);
  }
};

// RoPE of packed sequences t [total, h, d]; sequence j holds tokens [cu_seqlens[j], cu_seqlens[j+1]),
// its k-th token at position k of freqs [max_s, 1, 1, d2].
struct ForwardThd {
  static constexpr const char* kSchema =
      "fused_rope_forward_thd(Tensor t, Tensor cu_seqlens, Tensor freqs, *, bool interleaved=False) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& t, const at::Tensor& cu_seqlens, const at::Tensor& freqs, bool interleaved) {
    return thd<Device>(kForwardThdName, t, cu_seqlens, freqs, interleaved, false);
  }

  static void save(AutogradContext& ctx, const at::Tensor&, const at::Tensor& cu_seqlens, const at::Tensor& freqs,
                   bool interleaved, const at::Tensor&) {
    ctx.save_for_backward({cu_seqlens, freqs});
    ctx.saved_data["interleaved"] = interleaved;
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    const auto saved = ctx.get_saved_variables();
    return {call_op<BackwardThd>(grads[0], saved[0], saved[1], ctx.saved_data["interleaved"].toBool())};
  }
};

struct Backward2d {
  static constexpr const char* kSchema =
      "fused_rope_backward_2d(Tensor output_grads, Tensor cos_h, Tensor sin_h, Tensor cos_w, Tensor sin_w) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& grads, const at::Tensor& cos_h, const at::Tensor& sin_h,
                         const at::Tensor& cos_w, const at::Tensor& sin_w) {
    return image<Device>(kBackward2dName, grads, cos_h, sin_h, cos_w, sin_w, true);
  }
};

// 2-D RoPE of t [b, ih, iw, h, d]: the first d/2 dims of each head rotate by the row's angles
// (cos_h, sin_h [1, >= ih, 1, d/2]), the last d/2 by the column's (cos_w, sin_w); out [b, ih * iw, h, d].
struct Forward2d {
  static constexpr const char* kSchema =
      "fused_rope_forward_2d(Tensor t, Tensor cos_h, Tensor sin_h, Tensor cos_w, Tensor sin_w) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& t, const at::Tensor& cos_h, const at::Tensor& sin_h, const at::Tensor& cos_w,
                         const at::Tensor& sin_w) {
    return image<Device>(kForward2dName, t, cos_h, sin_h, cos_w, sin_w, false);
  }

  static void save(AutogradContext& ctx, const at::Tensor& t, const at::Tensor& cos_h, const at::Tensor& sin_h,
                   const at::Tensor& cos_w, const at::Tensor& sin_w, const at::Tensor&) {
    ctx.save_for_backward({cos_h, sin_h, cos_w, sin_w});
    ctx.saved_data["image_width"] = t.sym_size(2);
  }

  // The output (and its gradient) is [b, ih * iw, h, d]; t, and the op's gradient input, [b, ih, iw, h, d].
  static Grads backward(AutogradContext& ctx, Grads grads) {
    const auto saved = ctx.get_saved_variables();
    const at::Tensor& g = grads[0];
    const c10::SymInt width = ctx.saved_data["image_width"].toSymInt();
    const std::vector<c10::SymInt> image_shape{g.sym_size(0), g.sym_size(1) / width, width, g.sym_size(2),
                                               g.sym_size(3)};
    const at::Tensor grad = call_op<Backward2d>(g.reshape_symint(image_shape), saved[0], saved[1], saved[2], saved[3]);
    return {grad.view_symint(image_shape)};
  }
};

APEX_LIBRARY(m) {
  define_differentiable<Forward>(m);
  define<Backward>(m);
  define_differentiable<ForwardCached>(m);
  define<BackwardCached>(m);
  define_differentiable<ForwardThd>(m);
  define<BackwardThd>(m);
  define_differentiable<Forward2d>(m);
  define<Backward2d>(m);
}

}  // namespace apex::fused_rope
