// focal_loss: the ops (schema, checks, outputs, autograd), each declared once.
#include "apex/autograd.h"
#include "focal_loss.h"

namespace apex::focal_loss {
namespace {

// cls_output [..., classes] floating, cls_targets_at_level [...] int64, num_positives_sum float32 of
// one element, all on one device; returns the logits' Dtype.
Dtype check_inputs(const at::Tensor& cls_output, const at::Tensor& targets, const at::Tensor& num_positives_sum,
                   int64_t num_real_classes, const char* op) {
  const Dtype dtype = floating_dtype(cls_output, op, "cls_output");
  APEX_CHECK(cls_output.dim() >= 1 && targets.dim() == cls_output.dim() - 1 &&
                 targets.sym_sizes() == cls_output.sym_sizes().slice(0, cls_output.dim() - 1),
             op, ": cls_targets_at_level must have cls_output's shape without its last (class) dimension, got ",
             targets.sym_sizes(), " for cls_output of shape ", cls_output.sym_sizes());
  APEX_CHECK(targets.scalar_type() == at::kLong, op, ": cls_targets_at_level must be int64, got ",
             targets.scalar_type());
  APEX_CHECK(num_positives_sum.scalar_type() == at::kFloat && num_positives_sum.sym_numel() == 1, op,
             ": num_positives_sum must be a float32 tensor of one element, got ", num_positives_sum.scalar_type(),
             " of shape ", num_positives_sum.sym_sizes());
  APEX_CHECK(num_real_classes >= 0 && cls_output.sym_size(-1) >= num_real_classes, op,
             ": num_real_classes must be in [0, ", cls_output.sym_size(-1), "] (the classes of cls_output), got ",
             num_real_classes);
  check_same_device(targets, cls_output, op, "cls_targets_at_level", "cls_output");
  check_same_device(num_positives_sum, cls_output, op, "num_positives_sum", "cls_output");
  return dtype;
}

// The kernels' view of real tensors (contiguous copies kept alive by the caller).
Problem problem_of(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& num_positives_sum,
                   int64_t num_real_classes, double alpha, double gamma, double smoothing, Dtype dtype) {
  const int64_t classes = logits.size(-1);
  return {logits.const_data_ptr(), labels.const_data_ptr<int64_t>(), num_positives_sum.const_data_ptr<float>(),
          labels.numel(), classes, num_real_classes, dtype, alpha,
          gamma, smoothing};
}

}  // namespace

// The gradient of focal_loss_forward's loss in cls_output, given the loss's gradient (0-dim).
struct Backward {
  static constexpr const char* kSchema =
      "focal_loss_backward(Tensor grad_loss, Tensor cls_output, Tensor cls_targets_at_level, "
      "Tensor num_positives_sum, int num_real_classes, float alpha, float gamma, float label_smoothing=0.0) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& grad_loss, const at::Tensor& cls_output, const at::Tensor& targets,
                         const at::Tensor& num_positives_sum, int64_t num_real_classes, double alpha, double gamma,
                         double smoothing) {
    constexpr const char* op = "focal_loss_backward";
    const Dtype dtype = check_inputs(cls_output, targets, num_positives_sum, num_real_classes, op);
    APEX_CHECK(grad_loss.sym_numel() == 1, op, ": grad_loss must have one element, got shape ", grad_loss.sym_sizes());
    check_same_device(grad_loss, cls_output, op, "grad_loss", "cls_output");
    at::Tensor grad = at::empty_symint(cls_output.sym_sizes(), cls_output.options());
    launch<Device>(cls_output, [&](const auto& device) {
      const at::Tensor logits = cls_output.contiguous(), labels = targets.contiguous(), npos = num_positives_sum.contiguous();
      const at::Tensor g = grad_loss.to(statistics_dtype(cls_output.scalar_type())).contiguous();
      backward(device, problem_of(logits, labels, npos, num_real_classes, alpha, gamma, smoothing, dtype),
               g.const_data_ptr(), grad.mutable_data_ptr());
    });
    return grad;
  }
};

// The focal loss (0-dim, float32; float64 for float64 logits), differentiable in cls_output.
struct Forward {
  static constexpr const char* kSchema =
      "focal_loss_forward(Tensor cls_output, Tensor cls_targets_at_level, Tensor num_positives_sum, "
      "int num_real_classes, float alpha, float gamma, float label_smoothing=0.0) -> Tensor";

  template <class Device>
  static at::Tensor call(const at::Tensor& cls_output, const at::Tensor& targets, const at::Tensor& num_positives_sum,
                         int64_t num_real_classes, double alpha, double gamma, double smoothing) {
    const Dtype dtype = check_inputs(cls_output, targets, num_positives_sum, num_real_classes, "focal_loss_forward");
    at::Tensor loss = at::empty({}, cls_output.options().dtype(statistics_dtype(cls_output.scalar_type())));
    launch<Device>(cls_output, [&](const auto& device) {
      const at::Tensor logits = cls_output.contiguous(), labels = targets.contiguous(), npos = num_positives_sum.contiguous();
      const Problem problem = problem_of(logits, labels, npos, num_real_classes, alpha, gamma, smoothing, dtype);
      at::Tensor partials = at::empty({std::max<int64_t>(1, partials_size(device, problem))}, loss.options());
      forward(device, problem, partials.mutable_data_ptr(), loss.mutable_data_ptr());
    });
    return loss;
  }

  static void save(AutogradContext& ctx, const at::Tensor& cls_output, const at::Tensor& targets,
                   const at::Tensor& num_positives_sum, int64_t num_real_classes, double alpha, double gamma,
                   double smoothing, const at::Tensor& /*loss*/) {
    ctx.save_for_backward({cls_output, targets, num_positives_sum});
    ctx.saved_data["num_real_classes"] = num_real_classes;
    ctx.saved_data["alpha"] = alpha;
    ctx.saved_data["gamma"] = gamma;
    ctx.saved_data["smoothing"] = smoothing;
  }

  static Grads backward(AutogradContext& ctx, Grads grads) {
    const auto saved = ctx.get_saved_variables();
    return {call_op<Backward>(grads[0], saved[0], saved[1], saved[2], ctx.saved_data["num_real_classes"].toInt(),
                              ctx.saved_data["alpha"].toDouble(), ctx.saved_data["gamma"].toDouble(),
                              ctx.saved_data["smoothing"].toDouble())};
  }
};

APEX_LIBRARY(m) {
  define_differentiable<Forward>(m);
  define<Backward>(m);
}

}  // namespace apex::focal_loss
