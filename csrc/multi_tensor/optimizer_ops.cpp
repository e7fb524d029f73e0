// The optimizer steps of amp_C but LAMB's (lamb_ops.cpp; optimizer_ops.h says why apart)
// (torch.ops.apex.*; `amp_C.<name>` is the same function taking NVIDIA apex's list of tensor lists):
// NVIDIA's and ROCm's historical functions, and the ones apex's optimizers call
// (multi_tensor_novograd_step, multi_tensor_rmsprop, ...): those take step counts as tensors, one per
// tensor or one for all, read by the kernel on the device (or read now from the CPU), so one compiled
// graph serves every step and a CUDA graph replays them. None of them is differentiated.
#include <ATen/ops/empty.h>

#include "adadelta.h"
#include "adagrad.h"
#include "adam.h"
#include "adamp.h"
#include "lars.h"
#include "novograd.h"
#include "optimizer_ops.h"
#include "rmsprop.h"
#include "sgd.h"

namespace apex::multi_tensor {
namespace {

// ---- Adam ---------------------------------------------------------------------------------------

AdamArgs adam_args(const char* op, double beta1, double beta2, double epsilon, int64_t mode, bool bias_correction,
                   double weight_decay) {
  check_mode(op, mode, "L2, Adam", "decoupled weight decay, AdamW");
  AdamArgs a;
  a.beta1 = static_cast<float>(beta1);
  a.beta2 = static_cast<float>(beta2);
  a.epsilon = static_cast<float>(epsilon);
  a.weight_decay = static_cast<float>(weight_decay);
  a.mode = static_cast<int>(mode);
  a.bias_correction = bias_correction;
  return a;
}

struct Adam {
  static constexpr const char* kSchema =
      "multi_tensor_adam(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
      "Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, float lr, float beta1, float beta2, float epsilon, "
      "int step, int weight_decay_mode, int bias_correction, float weight_decay) -> ()";
  // Adam (mode 0) / AdamW (mode 1) with every scalar given now.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, double lr, double beta1, double beta2,
                   double epsilon, int64_t step, int64_t mode, int64_t bias_correction, double weight_decay) {
    constexpr const char* kName = "multi_tensor_adam";
    Lists lists = step_lists(kName, chunk_size, flag, grads, params,
                             {{exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"}}, Access::kRead,
                             /*allow_double=*/true);
    AdamFunctor op;
    op.a = adam_args(kName, beta1, beta2, epsilon, mode, bias_correction == 1, weight_decay);
    check_step(kName, static_cast<double>(step), op.a.bias_correction);
    op.a.lr = scalar_arg(lr);
    op.a.step = scalar_arg(static_cast<double>(step));
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      adam(device, view, flag_data, op);
    });
  }
};

// multi_tensor_adam_capturable (kMaster false) and multi_tensor_adam_capturable_master: lr, step and
// inv_scale are tensors (the steps one per tensor or one for all); a set flag skips the step; the
// grads are unscaled in place (as apex does) when inv_scale is not 1; with master params the step
// runs on them (float32) and the 16-bit params receive the result.
template <bool kMaster>
struct AdamCapturable {
  static constexpr const char* kSchema =
      kMaster ? "multi_tensor_adam_capturable_master(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, "
                "Tensor(c!)[] params, Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, Tensor(f!)[] master_params, "
                "Tensor lr, float beta1, float beta2, float epsilon, Tensor step, int weight_decay_mode, "
                "int bias_correction, float weight_decay, Tensor inv_scale) -> ()"
              : "multi_tensor_adam_capturable(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, "
                "Tensor(c!)[] params, Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, Tensor lr, float beta1, "
                "float beta2, float epsilon, Tensor step, int weight_decay_mode, int bias_correction, "
                "float weight_decay, Tensor inv_scale) -> ()";
  static constexpr const char* kName = kMaster ? "multi_tensor_adam_capturable_master" : "multi_tensor_adam_capturable";

  static void check(const Lists& lists, const at::Tensor& flag, const at::Tensor& lr, const at::Tensor& step,
                    const at::Tensor& inv_scale) {
    check_optimizer_lists(lists, {2, 3});
    lists.check_scalars({{"lr", lr}, {"step", step, /*per_tensor=*/true}, {"inv_scale", inv_scale}});
  }

  template <class Device>
  static void run(Lists& lists, const at::Tensor& flag, const at::Tensor& lr, double beta1, double beta2,
                  double epsilon, const at::Tensor& step, int64_t mode, int64_t bias_correction,
                  double weight_decay, const at::Tensor& inv_scale) {
    AdamFunctor op;
    op.a = adam_args(kName, beta1, beta2, epsilon, mode, bias_correction == 1, weight_decay);
    op.a.skip_if_flag_set = true;
    op.a.unscale_grads = true;
    op.has_master = kMaster;
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      std::vector<at::Tensor> keep;
      op.a.lr = scalar_arg(lr, flag, keep);
      op.a.step = step_arg(kName, step, flag, op.a.bias_correction, keep);
      op.a.inv_scale = scalar_arg(inv_scale, flag, keep);
      adam(device, view, flag_data, op);
    });
  }

  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, const at::Tensor& lr, double beta1,
                   double beta2, double epsilon, const at::Tensor& step, int64_t mode, int64_t bias_correction,
                   double weight_decay, const at::Tensor& inv_scale) {
    Lists lists = step_lists(kName, chunk_size, flag, grads, params,
                             {{exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"}}, Access::kReadWrite);
    check(lists, flag, lr, step, inv_scale);
    run<Device>(lists, flag, lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay, inv_scale);
  }
};

struct AdamCapturableMaster : AdamCapturable<true> {
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList master_params,
                   const at::Tensor& lr, double beta1, double beta2, double epsilon, const at::Tensor& step,
                   int64_t mode, int64_t bias_correction, double weight_decay, const at::Tensor& inv_scale) {
    Lists lists(kName, chunk_size, flag,
                {{grads, "grads", Access::kReadWrite}, {params, "params", Access::kWrite},
                 {exp_avgs, "exp_avgs", Access::kReadWrite}, {exp_avg_sqs, "exp_avg_sqs", Access::kReadWrite},
                 {master_params, "master_params", Access::kReadWrite}});
    check(lists, flag, lr, step, inv_scale);
    APEX_CHECK(lists.scalar_type(1) == at::kHalf || lists.scalar_type(1) == at::kBFloat16, kName,
               ": params must be float16 or bfloat16 (their float32 masters are updated), got ", lists.scalar_type(1));
    require_float32(lists, {2, 3, 4});
    run<Device>(lists, flag, lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay, inv_scale);
  }
};

struct BertAdam {
  static constexpr const char* kSchema =
      "multi_tensor_bert_adam(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, Tensor(c!)[] params, "
      "Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, float lr, float beta1, float beta2, float epsilon, "
      "Tensor step, float weight_decay, float max_grad_norm, int schedule, float warmup, float t_total) -> ()";
  // BertAdam (pytorch-pretrained-BERT, Ascend's NpuFusedBertAdam): Adam without bias correction,
  // decoupled weight decay, the grads clipped (in place) by their L2 norm over the call when
  // max_grad_norm > 0, and lr * schedule((step - 1) / t_total, warmup) when t_total > 0
  // (schedule: 0 none, 1 warmup_linear, 2 warmup_cosine, 3 warmup_constant, 4 warmup_poly).
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, double lr, double beta1, double beta2,
                   double epsilon, const at::Tensor& step, double weight_decay, double max_grad_norm,
                   int64_t schedule, double warmup, double t_total) {
    constexpr const char* kName = "multi_tensor_bert_adam";
    Lists lists = step_lists(kName, chunk_size, flag, grads, params,
                             {{exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"}}, Access::kReadWrite);
    lists.check_scalars({{"step", step, /*per_tensor=*/true}});
    APEX_CHECK(schedule >= 0 && schedule <= static_cast<int64_t>(LrSchedule::kWarmupPoly), kName,
               ": schedule must be 0 (none) to 4 (warmup_poly), got ", schedule);
    AdamFunctor op;
    op.a = adam_args(kName, beta1, beta2, epsilon, kAdamDecoupled, /*bias_correction=*/false, weight_decay);
    op.a.lr = scalar_arg(lr);
    op.a.unscale_grads = true;
    op.a.max_grad_norm = static_cast<float>(max_grad_norm);
    const bool scheduled = t_total > 0 && schedule != 0;
    op.a.schedule = scheduled ? static_cast<LrSchedule>(schedule) : LrSchedule::kNone;
    op.a.warmup = static_cast<float>(warmup);
    op.a.t_total = scheduled ? static_cast<float>(t_total) : 1.f;
    const at::Tensor grad_norm = at::empty({1}, flag.options().dtype(at::kFloat));
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      std::vector<at::Tensor> keep;
      op.a.step = step_arg(kName, step, flag, false, keep);
      if (op.a.max_grad_norm > 0.f) {
        const at::Tensor scratch = reduction_buffer(device, flag, lists.count());
        std::vector<void*> storage;
        NormArgs norms;
        norms.out.total = grad_norm.mutable_data_ptr<float>();
        norms.out.scratch = scratch.mutable_data_ptr<float>();
        norm(device, view.select({0}, storage), flag_data, norms);
        op.a.grad_norm.ptr = grad_norm.const_data_ptr<float>();
      }
      adam(device, view, flag_data, op);
    });
  }
};

struct Adamp {
  static constexpr const char* kSchema =
      "multi_tensor_adamp(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
      "Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, float lr, float beta1, float beta2, float epsilon, "
      "Tensor step, float weight_decay, float delta, float wd_ratio, bool nesterov) -> ()";
  // AdamP (see adamp.h): Adam whose direction loses its component along scale-invariant params
  // (per channel, dim 0, or per tensor), with weight decay scaled by wd_ratio there. The moments
  // are float32; steps one per tensor or one for all.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, double lr, double beta1, double beta2,
                   double epsilon, const at::Tensor& step, double weight_decay, double delta, double wd_ratio,
                   bool nesterov) {
    constexpr const char* kName = "multi_tensor_adamp";
    Lists lists = step_lists(kName, chunk_size, flag, grads, params,
                             {{exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"}});
    lists.require_rows_outermost();
    require_float32(lists, {2, 3});
    lists.check_scalars({{"step", step, /*per_tensor=*/true}});
    AdampArgs args;
    args.lr = static_cast<float>(lr);
    args.beta1 = static_cast<float>(beta1);
    args.beta2 = static_cast<float>(beta2);
    args.epsilon = static_cast<float>(epsilon);
    args.weight_decay = static_cast<float>(weight_decay);
    args.delta = static_cast<float>(delta);
    args.wd_ratio = static_cast<float>(wd_ratio);
    args.nesterov = nesterov;
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      std::vector<at::Tensor> keep;
      args.step = step_arg(kName, step, flag, true, keep);
      const RowLayout layout(view);
      const at::Tensor scratch =
          at::empty({layout.pieces * kAdampSums + layout.rows + view.count}, flag.options().dtype(at::kFloat));
      float* data = scratch.mutable_data_ptr<float>();
      adamp(device, view, flag_data, args,
            AdampBuffers{data, data + layout.pieces * kAdampSums, data + layout.pieces * kAdampSums + layout.rows});
    });
  }
};

// ---- SGD and LARS -------------------------------------------------------------------------------

// [grads, weights, momentum_buffers(, weights_out)] as run_momentum_step takes them.
void check_momentum_lists(const Lists& lists) {
  check_same_dtype(lists, 1, 2);
  const at::ScalarType grads = lists.scalar_type(0), weights = lists.scalar_type(1);
  const bool reduced_grads = grads == at::kHalf || grads == at::kBFloat16;
  APEX_CHECK(grads == weights || (reduced_grads && weights == at::kFloat), lists.op(),
             ": grads must have the weights' dtype (or be 16-bit with float32 weights), got ", grads, " and ", weights);
  if (!lists.has(3)) return;
  APEX_CHECK(weights == at::kFloat, lists.op(), ": with a weights_out list the weights must be float32, got ",
             weights);
  APEX_CHECK(lists.scalar_type(3) == grads || grads == at::kFloat, lists.op(),
             ": weights_out must have the grads' dtype (or any dtype with float32 grads), got ",
             lists.scalar_type(3), " and ", grads);
}

Lists momentum_lists(const char* op, int64_t chunk_size, const at::Tensor& flag, at::TensorList grads,
                     at::TensorList weights, at::TensorList momentum_buffers, at::TensorList weights_out) {
  return Lists(op, chunk_size, flag,
               {{grads, "grads"}, {weights, "weights", Access::kReadWrite},
                {momentum_buffers, "momentum_buffers", Access::kReadWrite},
                {weights_out, "weights_out", Access::kWrite, /*optional=*/true}});
}

struct Sgd {
  static constexpr const char* kSchema =
      "multi_tensor_sgd(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] weights, "
      "Tensor(c!)[] momentum_buffers, Tensor(d!)[] weights_out, float weight_decay, float momentum, "
      "float dampening, float lr, bool nesterov, bool first_run, bool weight_decay_after_momentum, "
      "float scale) -> ()";
  // SGD on grads * scale; skipped while the flag is set; weights_out (optional) gets a copy.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList weights,
                   at::TensorList momentum_buffers, at::TensorList weights_out, double weight_decay,
                   double momentum, double dampening, double lr, bool nesterov, bool first_run,
                   bool weight_decay_after_momentum, double scale) {
    Lists lists = momentum_lists("multi_tensor_sgd", chunk_size, flag, grads, weights, momentum_buffers, weights_out);
    check_momentum_lists(lists);
    SgdFunctor op;
    op.weight_decay = static_cast<float>(weight_decay);
    op.momentum = static_cast<float>(momentum);
    op.dampening = static_cast<float>(dampening);
    op.lr = static_cast<float>(lr);
    op.scale = static_cast<float>(scale);
    op.nesterov = nesterov;
    op.first_run = first_run;
    op.weight_decay_after_momentum = weight_decay_after_momentum;
    op.has_copy = lists.has(3);
    op.weight_dtype = lists.dtype(1);
    op.round_like_torch = op.weight_dtype != Dtype::kFloat32;
    sgd_alphas(op, op.round_like_torch && std::is_same_v<Device, Cpu>);
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      sgd(device, view, flag_data, op);
    });
  }
};

struct Lars {
  static constexpr const char* kSchema =
      "multi_tensor_lars(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] weights, "
      "Tensor(c!)[] momentum_buffers, Tensor(d!)[] weights_out, Tensor grad_norms, Tensor param_norms, float lr, "
      "float trust_coefficient, float epsilon, float weight_decay, float momentum, float dampening, bool nesterov, "
      "bool first_run, bool weight_decay_after_momentum, float scale, bool is_skipped) -> ()";
  // ROCm apex's LARS step; grad_norms and param_norms are the per-tensor L2 norms (float32 [n]).
  // dampening, first_run, weight_decay_after_momentum and scale are accepted for ROCm's signature
  // and, as in ROCm's kernel, not used.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList weights,
                   at::TensorList momentum_buffers, at::TensorList weights_out, const at::Tensor& grad_norms,
                   const at::Tensor& param_norms, double lr, double trust_coefficient, double epsilon,
                   double weight_decay, double momentum, double /*dampening*/, bool nesterov, bool /*first_run*/,
                   bool /*weight_decay_after_momentum*/, double /*scale*/, bool is_skipped) {
    constexpr const char* kName = "multi_tensor_lars";
    Lists lists = momentum_lists(kName, chunk_size, flag, grads, weights, momentum_buffers, weights_out);
    check_momentum_lists(lists);
    for (const auto* norms : {&grad_norms, &param_norms}) {
      APEX_CHECK(norms->scalar_type() == at::kFloat && norms->sym_numel() == lists.count() &&
                     norms->device() == flag.device(),
                 kName, ": grad_norms and param_norms must be float32 tensors of ", lists.count(),
                 " elements (one per tensor) on ", flag.device());
    }
    LarsFunctor op;
    op.lr = static_cast<float>(lr);
    op.trust_coefficient = static_cast<float>(trust_coefficient);
    op.epsilon = static_cast<float>(epsilon);
    op.weight_decay = static_cast<float>(weight_decay);
    op.momentum = static_cast<float>(momentum);
    op.nesterov = nesterov;
    op.is_skipped = is_skipped;
    op.has_copy = lists.has(3);
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      const at::Tensor g = grad_norms.contiguous(), p = param_norms.contiguous();
      op.grad_norms = g.const_data_ptr<float>();
      op.param_norms = p.const_data_ptr<float>();
      lars(device, view, flag_data, op);
    });
  }
};

// ---- NovoGrad, Adagrad, RMSprop, Adadelta --------------------------------------------------------

// multi_tensor_novograd (NVIDIA apex's, an int step) and multi_tensor_novograd_step (apex's
// optimizer: step counts as a tensor); grad_norms (float32 [n]) is blended in place.
template <bool kStep>
struct Novograd {
  static constexpr const char* kName = kStep ? "multi_tensor_novograd_step" : "multi_tensor_novograd";
  static constexpr const char* kSchema =
      kStep ? "multi_tensor_novograd_step(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
              "Tensor(c!)[] exp_avgs, Tensor(d!) grad_norms, float lr, float beta1, float beta2, float epsilon, "
              "Tensor step, int bias_correction, float weight_decay, int grad_averaging, int weight_decay_mode, "
              "int norm_type) -> ()"
            : "multi_tensor_novograd(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
              "Tensor(c!)[] exp_avgs, Tensor(d!) grad_norms, float lr, float beta1, float beta2, float epsilon, "
              "int step, int bias_correction, float weight_decay, int grad_averaging, int weight_decay_mode, "
              "int norm_type) -> ()";
  using Step = std::conditional_t<kStep, const at::Tensor&, int64_t>;

  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, const at::Tensor& grad_norms, double lr, double beta1, double beta2,
                   double epsilon, Step step, int64_t bias_correction, double weight_decay, int64_t grad_averaging,
                   int64_t mode, int64_t norm_type) {
    Lists lists = step_lists(kName, chunk_size, flag, grads, params, {{exp_avgs, "exp_avgs"}});
    check_same_dtype(lists, 1, 2);
    check_mode(kName, mode, "L2", "decoupled weight decay");
    APEX_CHECK(norm_type == 0 || norm_type == 2, kName, ": norm_type must be 0 (L-inf) or 2 (L2), got ", norm_type);
    APEX_CHECK(grad_norms.scalar_type() == at::kFloat && grad_norms.sym_numel() == lists.count() &&
                   grad_norms.is_contiguous() && grad_norms.device() == flag.device(),
               kName, ": grad_norms must be a contiguous float32 tensor of ", lists.count(), " elements on ",
               flag.device());
    NovogradFunctor op;
    op.lr = static_cast<float>(lr);
    op.beta1 = static_cast<float>(beta1);
    op.beta2 = static_cast<float>(beta2);
    op.beta3 = grad_averaging == 1 ? 1.f - op.beta1 : 1.f;
    op.epsilon = static_cast<float>(epsilon);
    op.weight_decay = static_cast<float>(weight_decay);
    op.mode = static_cast<int>(mode);
    op.bias_correction = bias_correction == 1;
    if constexpr (kStep) {
      lists.check_scalars({{"step", step, /*per_tensor=*/true}});
    } else {
      check_step(kName, static_cast<double>(step), op.bias_correction);
      op.step = scalar_arg(static_cast<double>(step));
    }
    const at::Tensor total = at::empty({1}, flag.options().dtype(at::kFloat));
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      std::vector<at::Tensor> keep;
      if constexpr (kStep) op.step = step_arg(kName, step, flag, op.bias_correction, keep);
      const at::Tensor scratch = reduction_buffer(device, flag, lists.count());
      novograd(device, view, flag_data, op, static_cast<int>(norm_type), grad_norms.mutable_data_ptr<float>(),
               total.mutable_data_ptr<float>(), scratch.mutable_data_ptr<float>());
    });
  }
};

struct Adagrad {
  static constexpr const char* kSchema =
      "multi_tensor_adagrad(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
      "Tensor(c!)[] state_sums, float lr, float epsilon, int weight_decay_mode, float weight_decay) -> ()";
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList state_sums, double lr, double epsilon, int64_t mode, double weight_decay) {
    constexpr const char* kName = "multi_tensor_adagrad";
    Lists lists = step_lists(kName, chunk_size, flag, grads, params, {{state_sums, "state_sums"}});
    check_mode(kName, mode, "L2", "decoupled");
    AdagradFunctor op;
    op.lr = static_cast<float>(lr);
    op.epsilon = static_cast<float>(epsilon);
    op.weight_decay = static_cast<float>(weight_decay);
    op.mode = static_cast<int>(mode);
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      adagrad(device, view, flag_data, op);
    });
  }
};

struct Rmsprop {
  static constexpr const char* kSchema =
      "multi_tensor_rmsprop(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
      "Tensor(c!)[] square_avgs, Tensor(d!)[] momentum_buffers, Tensor(e!)[] grad_avgs, float lr, float alpha, "
      "float epsilon, float weight_decay, float momentum, bool centered, bool tf_style, bool decoupled_decay, "
      "bool lr_in_momentum) -> ()";
  // torch.optim.RMSprop (tf_style false) or timm's RMSpropTF; momentum_buffers and grad_avgs are
  // empty lists without momentum / centering.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList square_avgs, at::TensorList momentum_buffers, at::TensorList grad_avgs, double lr,
                   double alpha, double epsilon, double weight_decay, double momentum, bool centered, bool tf_style,
                   bool decoupled_decay, bool lr_in_momentum) {
    constexpr const char* kName = "multi_tensor_rmsprop";
    Lists lists = step_lists(kName, chunk_size, flag, grads, params,
                             {{square_avgs, "square_avgs"},
                              {momentum_buffers, "momentum_buffers", Access::kReadWrite, /*optional=*/true},
                              {grad_avgs, "grad_avgs", Access::kReadWrite, /*optional=*/true}});
    APEX_CHECK(momentum <= 0 || lists.has(3), kName, ": momentum > 0 needs the momentum_buffers list");
    APEX_CHECK(!centered || lists.has(4), kName, ": centered needs the grad_avgs list");
    RmspropFunctor op;
    op.lr = static_cast<float>(lr);
    op.alpha = static_cast<float>(alpha);
    op.epsilon = static_cast<float>(epsilon);
    op.weight_decay = static_cast<float>(weight_decay);
    op.momentum = static_cast<float>(momentum);
    op.centered = centered;
    op.tf_style = tf_style;
    op.decoupled_decay = decoupled_decay;
    op.lr_in_momentum = lr_in_momentum;
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      rmsprop(device, view, flag_data, op);
    });
  }
};

struct Adadelta {
  static constexpr const char* kSchema =
      "multi_tensor_adadelta(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
      "Tensor(c!)[] square_avgs, Tensor(d!)[] acc_deltas, float lr, float rho, float epsilon, float weight_decay) "
      "-> ()";
  // torch.optim.Adadelta.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList square_avgs, at::TensorList acc_deltas, double lr, double rho, double epsilon,
                   double weight_decay) {
    Lists lists = step_lists("multi_tensor_adadelta", chunk_size, flag, grads, params,
                             {{square_avgs, "square_avgs"}, {acc_deltas, "acc_deltas"}});
    AdadeltaFunctor op;
    op.lr = static_cast<float>(lr);
    op.rho = static_cast<float>(rho);
    op.epsilon = static_cast<float>(epsilon);
    op.weight_decay = static_cast<float>(weight_decay);
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      adadelta(device, view, flag_data, op);
    });
  }
};

}  // namespace

APEX_LIBRARY(m) {
  define_multi_tensor<Adam>(m);
  define_multi_tensor<AdamCapturable<false>>(m);
  define_multi_tensor<AdamCapturableMaster>(m);
  define_multi_tensor<BertAdam>(m);
  define_multi_tensor<Adamp>(m);
  define_multi_tensor<Sgd>(m);
  define_multi_tensor<Lars>(m);
  define_multi_tensor<Novograd<false>>(m);
  define_multi_tensor<Novograd<true>>(m);
  define_multi_tensor<Adagrad>(m);
  define_multi_tensor<Rmsprop>(m);
  define_multi_tensor<Adadelta>(m);
}

}  // namespace apex::multi_tensor
