// The optimizer steps of amp_C (torch.ops.apex.*; `amp_C.<name>` is the same function taking NVIDIA
// apex's list of tensor lists): NVIDIA's and ROCm's historical functions, and the ones apex's
// optimizers call (multi_tensor_lamb_step, multi_tensor_novograd_step, multi_tensor_rmsprop, ...):
// those take step counts as tensors, one per tensor or one for all, read by the kernel on the
// device (or read now from the CPU), so one compiled graph serves every step and a CUDA graph
// replays them. None of them is differentiated.
#include <ATen/ops/empty.h>

#include "adadelta.h"
#include "adagrad.h"
#include "adam.h"
#include "adamp.h"
#include "apex/multi_tensor_op.h"
#include "lamb.h"
#include "lars.h"
#include "novograd.h"
#include "rmsprop.h"
#include "sgd.h"

namespace apex::multi_tensor {
namespace {

// Optimizer lists: grads in the params' dtype, each state list float32 or the params' dtype, and
// all state lists of one dtype.
void check_optimizer_lists(const Lists& lists, const std::vector<int>& states) {
  check_same_dtype(lists, 0, 1);
  for (int state : states) check_state_dtype(lists, 1, state);
  for (size_t i = 1; i < states.size(); ++i) check_same_dtype(lists, states[0], states[i]);
}

// The lists of an optimizer step, checked as check_optimizer_lists does: [grads, params, states...],
// the grads read (and written, `grads_access`, where the op unscales or clips them in place), the
// params and every state list read and written.
Lists step_lists(const char* op, int64_t chunk_size, const at::Tensor& flag, at::TensorList grads,
                 at::TensorList params, std::initializer_list<ListArg> states, Access grads_access = Access::kRead,
                 bool allow_double = false) {
  std::vector<ListArg> args{{grads, "grads", grads_access}, {params, "params", Access::kReadWrite}};
  std::vector<int> state_lists;
  for (ListArg state : states) {
    state.access = Access::kReadWrite;
    state_lists.push_back(static_cast<int>(args.size()));
    args.push_back(state);
  }
  Lists lists(op, chunk_size, flag, std::move(args), allow_double);
  check_optimizer_lists(lists, state_lists);
  return lists;
}

void check_mode(const char* op, int64_t mode, const char* zero, const char* one) {
  APEX_CHECK(mode == 0 || mode == 1, op, ": mode must be 0 (", zero, ") or 1 (", one, "), got ", mode);
}

// A step count of 0 with bias correction divides by 1 - beta^0 = 0: refused where it is known
// (steps read by the kernel on the device are the caller's to keep >= 1).
void check_step(const char* op, double step, bool bias_correction) {
  APEX_CHECK(!bias_correction || step >= 1, op, ": step must be >= 1 (the first step is 1), got ", step);
}

ScalarArg step_arg(const char* op, const at::Tensor& step, const at::Tensor& flag, bool bias_correction,
                   std::vector<at::Tensor>& keep) {
  const ScalarArg arg = scalar_arg(step, flag, keep);
  if (arg.ptr == nullptr) {
    check_step(op, arg.value, bias_correction);
  } else if (step.is_cpu() && bias_correction) {
    for (int64_t t = 0; t < (arg.per_tensor ? step.numel() : 1); ++t) check_step(op, arg.ptr[t], true);
  }
  return arg;
}

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

// ---- LAMB ---------------------------------------------------------------------------------------

void check_lamb_lists(const Lists& lists) {
  check_same_dtype(lists, 2, 3);
  check_state_dtype(lists, 1, 2);
  const at::ScalarType grads = lists.scalar_type(0), params = lists.scalar_type(1);
  APEX_CHECK(grads == params || params == at::kFloat, lists.op(),
             ": grads must have the params' dtype, or the params be float32 masters, got ", grads, " and ", params);
  if (lists.has(4)) {
    APEX_CHECK(lists.scalar_type(4) == grads, lists.op(), ": params_out must have the grads' dtype (", grads,
               "), got ", lists.scalar_type(4));
  }
}

Lists lamb_lists(const char* op, int64_t chunk_size, const at::Tensor& flag, at::TensorList grads,
                 at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList params_out) {
  Lists lists(op, chunk_size, flag,
              {{grads, "grads", Access::kReadWrite}, {params, "params", Access::kReadWrite},
               {exp_avgs, "exp_avgs", Access::kReadWrite}, {exp_avg_sqs, "exp_avg_sqs", Access::kReadWrite},
               {params_out, "params_out", Access::kWrite, /*optional=*/true}});
  check_lamb_lists(lists);
  return lists;
}

LambArgs lamb_args(const char* op, double beta1, double beta2, double epsilon, bool bias_correction,
                   double weight_decay, bool grad_averaging, int64_t mode) {
  check_mode(op, mode, "L2", "decoupled weight decay");
  LambArgs a;
  a.beta1 = static_cast<float>(beta1);
  a.beta2 = static_cast<float>(beta2);
  a.beta3 = grad_averaging ? 1.f - a.beta1 : 1.f;
  a.epsilon = static_cast<float>(epsilon);
  a.weight_decay = static_cast<float>(weight_decay);
  a.bias_correction = bias_correction;
  a.mode = static_cast<int>(mode);
  return a;
}

// One LAMB step; `resolve` fills the tensor-valued scalars of `args` inside the launch.
template <class Device, class Resolve>
void run_lamb_step(Lists& lists, const at::Tensor& flag, LambArgs args, Resolve&& resolve) {
  const auto options = flag.options().dtype(at::kFloat);
  launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
    std::vector<at::Tensor> keep;
    resolve(args, keep);
    const at::Tensor sums = at::empty({kLambSums * lists.count()}, options);
    const at::Tensor scratch = at::empty({lamb_scratch(device, view)}, options);
    lamb(device, view, flag_data, args, LambBuffers{sums.mutable_data_ptr<float>(), scratch.mutable_data_ptr<float>()});
  });
}

struct Lamb {
  static constexpr const char* kSchema =
      "multi_tensor_lamb(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, Tensor(c!)[] params, "
      "Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, float lr, float beta1, float beta2, float epsilon, "
      "int step, int bias_correction, float weight_decay, int grad_averaging, int weight_decay_mode, "
      "Tensor global_grad_norm, float max_grad_norm, bool? use_nvlamb=None) -> ()";
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, double lr, double beta1, double beta2,
                   double epsilon, int64_t step, int64_t bias_correction, double weight_decay,
                   int64_t grad_averaging, int64_t mode, const at::Tensor& global_grad_norm, double max_grad_norm,
                   std::optional<bool> use_nvlamb) {
    constexpr const char* kName = "multi_tensor_lamb";
    Lists lists = lamb_lists(kName, chunk_size, flag, grads, params, exp_avgs, exp_avg_sqs, {});
    lists.check_scalars({{"global_grad_norm", global_grad_norm}});
    LambArgs args = lamb_args(kName, beta1, beta2, epsilon, bias_correction == 1, weight_decay, grad_averaging == 1,
                              mode);
    check_step(kName, static_cast<double>(step), args.bias_correction);
    args.lr = scalar_arg(lr);
    args.step = scalar_arg(static_cast<double>(step));
    args.max_grad_norm = scalar_arg(max_grad_norm);
    args.trust = use_nvlamb.value_or(false) ? Trust::kAll : Trust::kDecayed;
    run_lamb_step<Device>(lists, flag, args, [&](LambArgs& a, std::vector<at::Tensor>& keep) {
      a.global_grad_norm = scalar_arg(global_grad_norm, flag, keep);
    });
  }
};

// multi_tensor_lamb_mp (NVIDIA apex's signature) and multi_tensor_lamb_step (apex's optimizers:
// trust ratio choice and a clamp of ||p||): every scalar that changes from step to step is a
// tensor, and found_inf skips the step.
template <bool kStep>
struct LambTensors {
  static constexpr const char* kName = kStep ? "multi_tensor_lamb_step" : "multi_tensor_lamb_mp";
  static constexpr const char* kSchema =
      kStep ? "multi_tensor_lamb_step(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, Tensor(c!)[] params, "
              "Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, Tensor(f!)[] params_out, Tensor lr, float beta1, "
              "float beta2, float epsilon, Tensor step, int bias_correction, float weight_decay, "
              "int grad_averaging, int weight_decay_mode, Tensor global_grad_norm, Tensor max_grad_norm, int trust, "
              "float max_param_norm, Tensor found_inf, Tensor inv_scale) -> ()"
            : "multi_tensor_lamb_mp(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, Tensor(c!)[] params, "
              "Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, Tensor(f!)[] params_out, Tensor lr, float beta1, "
              "float beta2, float epsilon, Tensor step, int bias_correction, float weight_decay, "
              "int grad_averaging, int weight_decay_mode, Tensor global_grad_norm, Tensor max_grad_norm, "
              "bool? use_nvlamb, Tensor found_inf, Tensor inv_scale) -> ()";

  template <class Device>
  static void run(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                  at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList params_out,
                  const at::Tensor& lr, double beta1, double beta2, double epsilon, const at::Tensor& step,
                  int64_t bias_correction, double weight_decay, int64_t grad_averaging, int64_t mode,
                  const at::Tensor& global_grad_norm, const at::Tensor& max_grad_norm, Trust trust,
                  double max_param_norm, const at::Tensor& found_inf, const at::Tensor& inv_scale) {
    Lists lists = lamb_lists(kName, chunk_size, flag, grads, params, exp_avgs, exp_avg_sqs, params_out);
    lists.check_scalars({{"lr", lr}, {"step", step, /*per_tensor=*/true}, {"global_grad_norm", global_grad_norm},
                         {"max_grad_norm", max_grad_norm}, {"found_inf", found_inf}, {"inv_scale", inv_scale}});
    LambArgs args = lamb_args(kName, beta1, beta2, epsilon, bias_correction == 1, weight_decay, grad_averaging == 1,
                              mode);
    args.trust = trust;
    args.max_param_norm = static_cast<float>(max_param_norm);
    // NVIDIA apex's lamb_mp norms are 0 while the flag is set; the optimizers' step (whose flag an
    // earlier norm may have set on inf grads) always uses them: found_inf decides the skip.
    args.zero_norms_while_flag_set = !kStep;
    run_lamb_step<Device>(lists, flag, args, [&](LambArgs& a, std::vector<at::Tensor>& keep) {
      a.lr = scalar_arg(lr, flag, keep);
      a.step = step_arg(kName, step, flag, a.bias_correction, keep);
      a.global_grad_norm = scalar_arg(global_grad_norm, flag, keep);
      a.max_grad_norm = scalar_arg(max_grad_norm, flag, keep);
      a.found_inf = scalar_arg(found_inf, flag, keep);
      a.inv_scale = scalar_arg(inv_scale, flag, keep);
    });
  }
};

struct LambMp : LambTensors<false> {
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList params_out,
                   const at::Tensor& lr, double beta1, double beta2, double epsilon, const at::Tensor& step,
                   int64_t bias_correction, double weight_decay, int64_t grad_averaging, int64_t mode,
                   const at::Tensor& global_grad_norm, const at::Tensor& max_grad_norm,
                   std::optional<bool> use_nvlamb, const at::Tensor& found_inf, const at::Tensor& inv_scale) {
    run<Device>(chunk_size, flag, grads, params, exp_avgs, exp_avg_sqs, params_out, lr, beta1, beta2, epsilon, step,
                bias_correction, weight_decay, grad_averaging, mode, global_grad_norm, max_grad_norm,
                use_nvlamb.value_or(false) ? Trust::kAll : Trust::kDecayed,
                std::numeric_limits<double>::infinity(), found_inf, inv_scale);
  }
};

struct LambStep : LambTensors<true> {
  // trust: 0 tensors with weight decay (LAMB), 1 all (NVLAMB, Lamb), 2 none (plain Adam steps).
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList params_out,
                   const at::Tensor& lr, double beta1, double beta2, double epsilon, const at::Tensor& step,
                   int64_t bias_correction, double weight_decay, int64_t grad_averaging, int64_t mode,
                   const at::Tensor& global_grad_norm, const at::Tensor& max_grad_norm, int64_t trust,
                   double max_param_norm, const at::Tensor& found_inf, const at::Tensor& inv_scale) {
    APEX_CHECK(trust >= 0 && trust <= 2, kName, ": trust must be 0 (decayed tensors), 1 (all) or 2 (none), got ",
               trust);
    APEX_CHECK(max_param_norm > 0, kName, ": max_param_norm must be positive, got ", max_param_norm);
    run<Device>(chunk_size, flag, grads, params, exp_avgs, exp_avg_sqs, params_out, lr, beta1, beta2, epsilon, step,
                bias_correction, weight_decay, grad_averaging, mode, global_grad_norm, max_grad_norm,
                static_cast<Trust>(trust), max_param_norm, found_inf, inv_scale);
  }
};

// [grads, params, exp_avgs, exp_avg_sqs, updates] of the ops that write LAMB's update direction:
// float32 but the grads. `updates` may be the grads themselves (each element is read before it is written).
Lists direction_lists(const char* op, int64_t chunk_size, const at::Tensor& flag, at::TensorList grads,
                      at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                      at::TensorList updates) {
  Lists lists(op, chunk_size, flag,
              {{grads, "grads"}, {params, "params"}, {exp_avgs, "exp_avgs", Access::kReadWrite},
               {exp_avg_sqs, "exp_avg_sqs", Access::kReadWrite}, {updates, "updates", Access::kWrite}});
  require_float32(lists, {1, 2, 3, 4});
  return lists;
}

struct LambStage1 {
  static constexpr const char* kSchema =
      "multi_tensor_lamb_stage1(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor[] params, "
      "Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] updates, Tensor per_tensor_decay, int step, "
      "float beta1, float beta2, float epsilon, Tensor global_grad_norm, float max_global_grad_norm) -> ()";
  // apex's first LAMB (amp_C.multi_tensor_lamb_stage1_cuda, any device despite the name): bias
  // correction, (1 - beta1) averaging, decoupled decay per tensor; the update goes to `updates`.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList updates,
                   const at::Tensor& per_tensor_decay, int64_t step, double beta1, double beta2, double epsilon,
                   const at::Tensor& global_grad_norm, double max_global_grad_norm) {
    constexpr const char* kName = "multi_tensor_lamb_stage1";
    Lists lists = direction_lists(kName, chunk_size, flag, grads, params, exp_avgs, exp_avg_sqs, updates);
    lists.check_scalars({{"global_grad_norm", global_grad_norm}});
    APEX_CHECK(per_tensor_decay.scalar_type() == at::kFloat && per_tensor_decay.sym_numel() == lists.count() &&
                   per_tensor_decay.device() == flag.device(),
               kName, ": per_tensor_decay must be a float32 tensor of ", lists.count(), " elements on ",
               flag.device());
    check_step(kName, static_cast<double>(step), true);
    LambDirectionFunctor op;
    op.a = lamb_args(kName, beta1, beta2, epsilon, true, 0.0, true, kLambDecoupled);
    op.a.step = scalar_arg(static_cast<double>(step));
    op.a.max_grad_norm = scalar_arg(max_global_grad_norm);
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      std::vector<at::Tensor> keep;
      const at::Tensor decay = per_tensor_decay.contiguous();
      op.a.per_tensor_decay = decay.const_data_ptr<float>();
      op.a.global_grad_norm = scalar_arg(global_grad_norm, flag, keep);
      lamb_direction(device, view, flag_data, op);
    });
  }
};

struct LambDirection {
  static constexpr const char* kSchema =
      "multi_tensor_lamb_direction(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor[] params, "
      "Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] updates, float beta1, float beta2, "
      "float epsilon, Tensor step, int bias_correction, float weight_decay, int grad_averaging, "
      "int weight_decay_mode, Tensor global_grad_norm, float max_grad_norm, Tensor inv_scale) -> ()";
  // LAMB's update direction, every option of multi_tensor_lamb_step but the trust ratio, which the
  // caller applies once it has whole-parameter norms (DistributedFusedLAMB, whose parameters are
  // split over ranks: multi_tensor_lamb_stage2). The grads times inv_scale, divided by
  // global_grad_norm / max_grad_norm where that exceeds 1 (global_grad_norm: of the unscaled grads;
  // max_grad_norm inf never clips), L2 (mode 0) or decoupled (mode 1) weight decay, (1 - beta1)
  // averaging, the moments updated and bias corrected at `step` (one per tensor or one for all).
  // The flag is not read: nothing is skipped.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params,
                   at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList updates, double beta1,
                   double beta2, double epsilon, const at::Tensor& step, int64_t bias_correction, double weight_decay,
                   int64_t grad_averaging, int64_t mode, const at::Tensor& global_grad_norm, double max_grad_norm,
                   const at::Tensor& inv_scale) {
    constexpr const char* kName = "multi_tensor_lamb_direction";
    Lists lists = direction_lists(kName, chunk_size, flag, grads, params, exp_avgs, exp_avg_sqs, updates);
    lists.check_scalars(
        {{"step", step, /*per_tensor=*/true}, {"global_grad_norm", global_grad_norm}, {"inv_scale", inv_scale}});
    APEX_CHECK(max_grad_norm > 0, kName, ": max_grad_norm must be positive (inf never clips), got ", max_grad_norm);
    LambDirectionFunctor op;
    op.a = lamb_args(kName, beta1, beta2, epsilon, bias_correction == 1, weight_decay, grad_averaging == 1, mode);
    op.a.max_grad_norm = scalar_arg(max_grad_norm);
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      std::vector<at::Tensor> keep;
      op.a.step = step_arg(kName, step, flag, op.a.bias_correction, keep);
      op.a.global_grad_norm = scalar_arg(global_grad_norm, flag, keep);
      op.a.inv_scale = scalar_arg(inv_scale, flag, keep);
      lamb_direction(device, view, flag_data, op);
    });
  }
};

struct LambStage2 {
  static constexpr const char* kSchema =
      "multi_tensor_lamb_stage2(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] params, Tensor[] updates, "
      "Tensor per_tensor_param_norm, Tensor per_tensor_update_norm, float lr, float weight_decay, "
      "bool? use_nvlamb=None) -> ()";
  // p -= lr * trust_ratio * update (amp_C.multi_tensor_lamb_stage2_cuda, any device despite the name).
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList params, at::TensorList updates,
                   const at::Tensor& param_norms, const at::Tensor& update_norms, double lr, double weight_decay,
                   std::optional<bool> use_nvlamb) {
    constexpr const char* kName = "multi_tensor_lamb_stage2";
    Lists lists(kName, chunk_size, flag, {{params, "params", Access::kReadWrite}, {updates, "updates"}});
    APEX_CHECK(lists.scalar_type(1) == at::kFloat, kName, ": updates must be float32, got ", lists.scalar_type(1));
    for (const auto* norms : {&param_norms, &update_norms}) {
      APEX_CHECK(norms->scalar_type() == at::kFloat && norms->sym_numel() == lists.count() &&
                     norms->device() == flag.device(),
                 kName, ": the per-tensor norms must be float32 tensors of ", lists.count(), " elements on ",
                 flag.device());
    }
    LambStage2Functor op;
    op.t.lr = scalar_arg(lr);
    op.t.weight_decay = static_cast<float>(weight_decay);
    op.t.trust = use_nvlamb.value_or(false) ? Trust::kAll : Trust::kDecayed;
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      const at::Tensor p = param_norms.contiguous(), u = update_norms.contiguous();
      op.param_norms = p.const_data_ptr<float>();
      op.update_norms = u.const_data_ptr<float>();
      lamb_stage2(device, view, flag_data, op);
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
  define_multi_tensor<Lamb>(m);
  define_multi_tensor<LambMp>(m);
  define_multi_tensor<LambStep>(m);
  define_multi_tensor<LambStage1>(m);
  define_multi_tensor<LambDirection>(m);
  define_multi_tensor<LambStage2>(m);
  define_multi_tensor<Novograd<false>>(m);
  define_multi_tensor<Novograd<true>>(m);
  define_multi_tensor<Adagrad>(m);
  define_multi_tensor<Rmsprop>(m);
  define_multi_tensor<Adadelta>(m);
}

}  // namespace apex::multi_tensor
