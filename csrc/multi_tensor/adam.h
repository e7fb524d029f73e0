// Adam / AdamW: multi_tensor_adam (scalars from the host), multi_tensor_adam_capturable
// (lr, step and the grad scaler's inv_scale read from device tensors, so a CUDA graph can
// replay the step; skipped while the flag is set) and multi_tensor_adam_capturable_master
// (the same, updating fp32 master weights and writing their copy into the model params).
#pragma once

#include <torch/library.h>

#include "apex/multi_tensor_apply_common.h"

namespace apex::multi_tensor {

enum AdamMode : int { kAdamL2 = 0, kAdamDecoupled = 1 };  // apex's ADAM_MODE_0 (Adam) / ADAM_MODE_1 (AdamW)

struct AdamScalars {
  float lr, beta1, beta2, epsilon, weight_decay;
  float bias_correction1 = 1.f, bias_correction2 = 1.f;
  int mode;

  APEX_HD void set_step(float step, bool bias_correction) {
    bias_correction1 = bias_correction ? 1.f - pow_scalar(beta1, step) : 1.f;
    bias_correction2 = bias_correction ? 1.f - pow_scalar(beta2, step) : 1.f;
  }

  // One Adam step of one element, in apex's order of operations.
  template <class V>
  APEX_HD void update(V g, V& p, V& m, V& v) const {
    if (mode == kAdamL2) g = g + V(weight_decay) * p;
    m = V(beta1) * m + V(1.f - beta1) * g;
    v = V(beta2) * v + V(1.f - beta2) * g * g;
    const V denom = VecMath<V>::sqrt(v / V(bias_correction2)) + V(epsilon);
    V step = (m / V(bias_correction1)) / denom;
    if (mode == kAdamDecoupled) step = step + V(weight_decay) * p;
    p = p - V(lr) * step;
  }
};

// lists: [grads, params, exp_avgs, exp_avg_sqs]
struct AdamFunctor : FunctorBase<AdamFunctor> {
  AdamScalars s;
  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2, 3}); }
  APEX_HD ListMask writes() const { return lists_mask({1, 2, 3}); }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m, V& v) const {
    s.update(g, p, m, v);
  }
};

// lists: [grads, params, exp_avgs, exp_avg_sqs(, master_params)]. Grads are unscaled in place
// (g *= inv_scale); with master params the step runs on them and params receive the result.
struct AdamCapturableFunctor : FunctorBase<AdamCapturableFunctor> {
  static constexpr bool kSkipIfFlagSet = true;
  AdamScalars s;
  ScalarArg lr, step, inv_scale;
  bool bias_correction;
  bool has_master = false;
  float inv_scale_value = 1.f;

  // With master params, the model params are only written.
  APEX_HD ListMask reads() const { return has_master ? lists_mask({0, 2, 3, 4}) : lists_mask({0, 1, 2, 3}); }
  APEX_HD ListMask writes() const { return lists_mask({0, 1, 2, 3, 4}); }
  APEX_HD AdamCapturableFunctor at_tensor(int) const {
    AdamCapturableFunctor resolved = *this;
    resolved.s.lr = lr.get();
    resolved.s.set_step(step.get(), bias_correction);
    resolved.inv_scale_value = inv_scale.get();
    return resolved;
  }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m, V& v) const {
    g = g * V(inv_scale_value);
    s.update(g, p, m, v);
  }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m, V& v, V& master) const {
    g = g * V(inv_scale_value);
    s.update(g, master, m, v);
    p = master;
  }
};

inline AdamScalars adam_scalars(double lr, double beta1, double beta2, double epsilon, int64_t mode,
                                double weight_decay) {
  APEX_CHECK(mode == kAdamL2 || mode == kAdamDecoupled, "multi_tensor_adam: mode must be 0 (L2, Adam) or 1 ",
             "(decoupled weight decay, AdamW), got ", mode);
  AdamScalars s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.epsilon = static_cast<float>(epsilon);
  s.weight_decay = static_cast<float>(weight_decay);
  s.mode = static_cast<int>(mode);
  return s;
}

template <class Engine>
void multi_tensor_adam(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads, at::TensorList params,
                       at::TensorList exp_avgs, at::TensorList exp_avg_sqs, double lr, double beta1, double beta2,
                       double epsilon, int64_t step, int64_t mode, int64_t bias_correction, double weight_decay) {
  constexpr const char* kName = "multi_tensor_adam";
  AdamFunctor op;
  op.s = adam_scalars(lr, beta1, beta2, epsilon, mode, weight_decay);
  op.s.set_step(static_cast<float>(step), bias_correction == 1);
  const auto param_dtype = list_dtype(kName, params, "params");
  APEX_CHECK(list_dtype(kName, grads, "grads") == param_dtype, kName, ": grads must have the params' dtype");
  const auto state_dtype = list_dtype(kName, exp_avgs, "exp_avgs");
  APEX_CHECK(list_dtype(kName, exp_avg_sqs, "exp_avg_sqs") == state_dtype, kName,
             ": exp_avgs and exp_avg_sqs must share one dtype");
  dispatch_param_state<true>(kName, param_dtype, state_dtype, [&](auto p, auto s) {
    using P = typename decltype(p)::type;
    using S = typename decltype(s)::type;
    Engine::template elementwise<TypeList<P, P, S, S>>(kName, chunk_size, noop_flag,
                                                       {grads, params, exp_avgs, exp_avg_sqs}, op);
  });
}

// Shared by the two capturable entry points; `master_params` is empty for the plain one.
template <class Engine>
void adam_capturable(const char* name, int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads,
                     at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                     at::TensorList master_params, const at::Tensor& lr, double beta1, double beta2, double epsilon,
                     const at::Tensor& step, int64_t mode, int64_t bias_correction, double weight_decay,
                     const at::Tensor& inv_scale) {
  check_scalar_tensor(name, lr, noop_flag, "lr", {at::kFloat, at::kDouble});
  check_scalar_tensor(name, step, noop_flag, "step", {at::kInt, at::kLong, at::kFloat, at::kDouble});
  check_scalar_tensor(name, inv_scale, noop_flag, "inv_scale", {at::kFloat});
  // Stream-ordered device-side conversions: nothing synchronises, so CUDA graphs can capture them.
  const at::Tensor lr_f = lr.to(at::kFloat), step_f = step.to(at::kFloat);
  AdamCapturableFunctor op;
  op.s = adam_scalars(0.0, beta1, beta2, epsilon, mode, weight_decay);
  op.lr.ptr = lr_f.data_ptr<float>();
  op.step.ptr = step_f.data_ptr<float>();
  op.inv_scale.ptr = inv_scale.data_ptr<float>();
  op.bias_correction = bias_correction == 1;
  op.has_master = !master_params.empty();

  const auto param_dtype = list_dtype(name, params, "params");
  APEX_CHECK(list_dtype(name, grads, "grads") == param_dtype, name, ": grads must have the params' dtype");
  const auto state_dtype = list_dtype(name, exp_avgs, "exp_avgs");
  APEX_CHECK(list_dtype(name, exp_avg_sqs, "exp_avg_sqs") == state_dtype, name,
             ": exp_avgs and exp_avg_sqs must share one dtype");
  if (master_params.empty()) {
    dispatch_param_state(name, param_dtype, state_dtype, [&](auto p, auto s) {
      using P = typename decltype(p)::type;
      using S = typename decltype(s)::type;
      Engine::template elementwise<TypeList<P, P, S, S>>(name, chunk_size, noop_flag,
                                                         {grads, params, exp_avgs, exp_avg_sqs}, op);
    });
    return;
  }
  APEX_CHECK(state_dtype == at::kFloat && list_dtype(name, master_params, "master_params") == at::kFloat, name,
             ": master params and optimizer states must be float32");
  dispatch_floating(param_dtype, name, "params", [&](auto p) {
    using P = typename decltype(p)::type;
    Engine::template elementwise<TypeList<P, P, float, float, float>>(
        name, chunk_size, noop_flag, {grads, params, exp_avgs, exp_avg_sqs, master_params}, op);
  });
}

template <class Engine>
void multi_tensor_adam_capturable(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads,
                                  at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                                  const at::Tensor& lr, double beta1, double beta2, double epsilon,
                                  const at::Tensor& step, int64_t mode, int64_t bias_correction, double weight_decay,
                                  const at::Tensor& inv_scale) {
  adam_capturable<Engine>("multi_tensor_adam_capturable", chunk_size, noop_flag, grads, params, exp_avgs,
                          exp_avg_sqs, {}, lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay,
                          inv_scale);
}

template <class Engine>
void multi_tensor_adam_capturable_master(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads,
                                         at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                                         at::TensorList master_params, const at::Tensor& lr, double beta1,
                                         double beta2, double epsilon, const at::Tensor& step, int64_t mode,
                                         int64_t bias_correction, double weight_decay, const at::Tensor& inv_scale) {
  adam_capturable<Engine>("multi_tensor_adam_capturable_master", chunk_size, noop_flag, grads, params, exp_avgs,
                          exp_avg_sqs, master_params, lr, beta1, beta2, epsilon, step, mode, bias_correction,
                          weight_decay, inv_scale);
}

// Registers this file's ops for the dispatch key of `m` (CPU or CUDA), run by `Engine`.
template <class Engine>
void register_adam_kernels(torch::Library& m) {
  m.impl("multi_tensor_adam", &multi_tensor_adam<Engine>);
  m.impl("multi_tensor_adam_capturable", &multi_tensor_adam_capturable<Engine>);
  m.impl("multi_tensor_adam_capturable_master", &multi_tensor_adam_capturable_master<Engine>);
}

}  // namespace apex::multi_tensor
