// The LAMB steps of amp_C (torch.ops.apex.*; `amp_C.<name>` is the same function taking NVIDIA apex's
// list of tensor lists): NVIDIA's multi_tensor_lamb, multi_tensor_lamb_mp and two-stage API, and the
// multi_tensor_lamb_step of apex's optimizers (step counts as tensors, read by the kernel on the
// device). The other steps: optimizer_ops.cpp. None of them is differentiated.
#include <ATen/ops/empty.h>

#include "lamb.h"
#include "optimizer_ops.h"

namespace apex::multi_tensor {
namespace {

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

}  // namespace

APEX_LIBRARY(m) {
  define_multi_tensor<Lamb>(m);
  define_multi_tensor<LambMp>(m);
  define_multi_tensor<LambStep>(m);
  define_multi_tensor<LambStage1>(m);
  define_multi_tensor<LambDirection>(m);
  define_multi_tensor<LambStage2>(m);
}

}  // namespace apex::multi_tensor
