// fused_softmax: the ops of the four historical scaled-softmax modules (schema, argument checks,
// outputs, autograd), each declared once; apex/op.h turns them into torch.ops.apex.* ops with CPU,
// CUDA and Meta (shape) kernels. One set of kernels (fused_softmax.h) serves all four:
//
//   module                                    forward input            masking
//   scaled_softmax_cuda                       [b, np, sq, sk]          none
//   scaled_masked_softmax_cuda                [b, np, sq, sk] + mask   mask [b|1, np|1, sq|1, sk]
//   generic_scaled_masked_softmax_cuda        [b, np, sq, sk] + mask   same (upstream: any sk)
//   scaled_upper_triang_masked_softmax_cuda   [attn_batches, sq, sk]   causal (sq == sk)
//
// Each has forward(..., scale) (differentiable here) and backward(output_grads, softmax_results,
// scale), which returns a new tensor (upstream wrote into output_grads). Any sk, float32 as well as
// float16/bfloat16; a fully masked row gives zeros (upstream: a uniform row).
#include "apex/autograd.h"
#include "fused_softmax.h"

namespace apex::fused_softmax {
namespace {

// Scores of the module's rank, float32 / float16 / bfloat16; returns their kernel dtype.
Dtype check_scores(const at::Tensor& t, int64_t dims, const char* op, const char* what) {
  APEX_CHECK(t.dim() == dims, op, ": ", what, " must be ", dims, "-D ",
             dims == 3 ? "[attn_batches, sq, sk]" : "[b, np, sq, sk]", ", got shape ", t.sym_sizes());
  return floating_dtype(t, op, what, /*allow_double=*/false);
}

void check_mask(const at::Tensor& mask, const at::Tensor& input, const char* op) {
  APEX_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kByte, op,
             ": mask must be bool (True = masked out), got ", mask.scalar_type());
  APEX_CHECK(mask.dim() == 4 && mask.sym_size(3) == input.sym_size(3), op,
             ": mask must be 4-D [b or 1, np or 1, sq or 1, sk] with sk = ", input.sym_size(3), ", got shape ",
             mask.sym_sizes());
  for (int64_t d = 0; d < 3; ++d) {
    APEX_CHECK(mask.sym_size(d) == 1 || mask.sym_size(d) == input.sym_size(d), op, ": mask of shape ",
               mask.sym_sizes(), " does not broadcast to input's shape ", input.sym_sizes());
  }
  check_same_device(mask, input, op, "mask", "input");
}

// A stride the kernels can use for a mask dimension: 0 where it broadcasts.
int64_t broadcast_stride(const at::Tensor& mask, int64_t d) { return mask.size(d) == 1 ? 0 : mask.stride(d); }

template <class Device>
at::Tensor forward_impl(const at::Tensor& input, const at::Tensor* mask, bool causal, int64_t dims, double scale,
                        const char* op) {
  const Dtype dtype = check_scores(input, dims, op, "input");
  if (causal) {
    APEX_CHECK(input.sym_size(-2) == input.sym_size(-1), op,
               ": the causal (upper triangular) mask needs square scores, sq == sk; got shape ", input.sym_sizes());
  }
  if (mask != nullptr) check_mask(*mask, input, op);
  at::Tensor y = at::empty_symint(input.sym_sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  launch<Device>(input, [&](const auto& device) {
    const at::Tensor x = input.contiguous();
    const int64_t cols = x.size(-1);
    ForwardArgs args{x.const_data_ptr(), y.mutable_data_ptr(), dtype, cols == 0 ? 0 : x.numel() / cols, cols,
                     x.size(-2), dims == 4 ? x.size(1) : 1, static_cast<float>(scale), causal, nullptr, 0, 0, 0};
    at::Tensor kept_mask;
    if (mask != nullptr) {
      kept_mask = mask->size(3) > 1 && mask->stride(3) != 1 ? mask->contiguous() : *mask;
      args.mask = static_cast<const uint8_t*>(kept_mask.const_data_ptr());
      args.mask_batch_stride = broadcast_stride(kept_mask, 0);
      args.mask_head_stride = broadcast_stride(kept_mask, 1);
      args.mask_query_stride = broadcast_stride(kept_mask, 2);
    }
    forward(device, args);
  });
  return y;
}

template <class Device>
at::Tensor backward_impl(const at::Tensor& grad_y, const at::Tensor& y, bool causal, int64_t dims, double scale,
                         const char* op) {
  const Dtype dtype = check_scores(y, dims, op, "softmax_results");
  check_scores(grad_y, dims, op, "output_grads");
  APEX_CHECK(grad_y.scalar_type() == y.scalar_type() && grad_y.sym_sizes() == y.sym_sizes(), op,
             ": output_grads must match softmax_results (", y.scalar_type(), ", shape ", y.sym_sizes(), "), got ",
             grad_y.scalar_type(), " of shape ", grad_y.sym_sizes());
  check_same_device(grad_y, y, op, "output_grads", "softmax_results");
  at::Tensor grad_x = at::empty_symint(y.sym_sizes(), y.options().memory_format(at::MemoryFormat::Contiguous));
  launch<Device>(y, [&](const auto& device) {
    const at::Tensor g = grad_y.contiguous(), p = y.contiguous();
    const int64_t cols = p.size(-1);
    backward(device, BackwardArgs{g.const_data_ptr(), p.const_data_ptr(), grad_x.mutable_data_ptr(), dtype,
                                  cols == 0 ? 0 : p.numel() / cols, cols, p.size(-2), static_cast<float>(scale),
                                  causal});
  });
  return grad_x;
}

// ---- the four modules ---------------------------------------------------------------------

// How a module lays out its scores: [b, np, sq, sk] with an optional padding mask, or the causal
// module's [attn_batches, sq, sk].
struct PaddedScores {
  static constexpr int64_t kDims = 4;
  static constexpr bool kCausal = false;
};
struct CausalScores {
  static constexpr int64_t kDims = 3;
  static constexpr bool kCausal = true;
};

struct ScaledSoftmax : PaddedScores {
  static constexpr const char* kForward = "scaled_softmax_forward(Tensor input, float scale) -> Tensor";
  static constexpr const char* kBackward =
      "scaled_softmax_backward(Tensor output_grads, Tensor softmax_results, float scale) -> Tensor";
};

struct ScaledMaskedSoftmax : PaddedScores {
  static constexpr const char* kForward =
      "scaled_masked_softmax_forward(Tensor input, Tensor mask, float scale) -> Tensor";
  static constexpr const char* kBackward =
      "scaled_masked_softmax_backward(Tensor output_grads, Tensor softmax_results, float scale) -> Tensor";
};

struct GenericScaledMaskedSoftmax : PaddedScores {
  static constexpr const char* kForward =
      "generic_scaled_masked_softmax_forward(Tensor input, Tensor mask, float scale) -> Tensor";
  static constexpr const char* kBackward =
      "generic_scaled_masked_softmax_backward(Tensor output_grads, Tensor softmax_results, float scale) -> Tensor";
};

struct ScaledUpperTriangMaskedSoftmax : CausalScores {
  static constexpr const char* kForward =
      "scaled_upper_triang_masked_softmax_forward(Tensor input, float scale) -> Tensor";
  static constexpr const char* kBackward =
      "scaled_upper_triang_masked_softmax_backward(Tensor output_grads, Tensor softmax_results, float scale) -> Tensor";
};

// The padding mask forward_impl takes: the forward's mask argument, or none.
const at::Tensor* mask_or_null() { return nullptr; }
const at::Tensor* mask_or_null(const at::Tensor& mask) { return &mask; }

}  // namespace

// The op name in a module's schema ("scaled_softmax_forward"), made once, for argument-check messages.
template <const char* const& kSchema>
const char* op_name() {
  static const std::string name = detail::op_name(kSchema);
  return name.c_str();
}

// backward(output_grads, softmax_results, scale) of a module: grad_x = scale * y * (g - sum(g * y)).
template <class Module>
struct Backward {
  static constexpr const char* kSchema = Module::kBackward;

  template <class Device>
  static at::Tensor call(const at::Tensor& output_grads, const at::Tensor& softmax_results, double scale) {
    return backward_impl<Device>(output_grads, softmax_results, Module::kCausal, Module::kDims, scale,
                                 op_name<Module::kBackward>());
  }
};

// forward(input, [mask,] scale) of a module: `Mask...` is empty, or at::Tensor for the two
// padding-mask modules. Differentiable: backward reads the saved probabilities.
template <class Module, class... Mask>
struct Forward {
  static constexpr const char* kSchema = Module::kForward;

  template <class Device>
  static at::Tensor call(const at::Tensor& input, const Mask&... mask, double scale) {
    return forward_impl<Device>(input, mask_or_null(mask...), Module::kCausal, Module::kDims, scale,
                                op_name<Module::kForward>());
  }

  static void save(AutogradContext& ctx, const at::Tensor&, const Mask&..., double scale, const at::Tensor& y) {
    ctx.save_for_backward({y});
    ctx.saved_data["scale"] = scale;
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    return {call_op<Backward<Module>>(grads[0], ctx.get_saved_variables()[0], ctx.saved_data["scale"].toDouble())};
  }
};

APEX_LIBRARY(m) {
  define_differentiable<Forward<ScaledSoftmax>>(m);
  define<Backward<ScaledSoftmax>>(m);
  define_differentiable<Forward<ScaledMaskedSoftmax, at::Tensor>>(m);
  define<Backward<ScaledMaskedSoftmax>>(m);
  define_differentiable<Forward<GenericScaledMaskedSoftmax, at::Tensor>>(m);
  define<Backward<GenericScaledMaskedSoftmax>>(m);
  define_differentiable<Forward<ScaledUpperTriangMaskedSoftmax>>(m);
  define<Backward<ScaledUpperTriangMaskedSoftmax>>(m);
}

}  // namespace apex::fused_softmax
