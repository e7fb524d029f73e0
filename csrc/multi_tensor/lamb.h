// LAMB: multi_tensor_lamb (all lists one dtype), multi_tensor_lamb_mp (fp32 master params and
// states, 16-bit grads, lr/step/norms on the device, skipped when found_inf is set) and the
// two-stage API of apex's older LAMB (multi_tensor_lamb_stage1_cuda / _stage2_cuda).
//   stage 1: Adam-style moments on grads clipped by the global grad norm -> update
//   stage 2: p -= lr * trust_ratio * update, trust_ratio = ||p|| / ||update|| per tensor
#pragma once

#include <torch/library.h>

#include "apex/multi_tensor_apply_common.h"
#include "l2norm.h"

namespace apex::multi_tensor {

enum LambMode : int { kLambL2 = 0, kLambDecoupled = 1 };  // weight decay in the moments, or on the update

// lists: [grads, params, exp_avgs, exp_avg_sqs(, updates)]: the update is written into
// `updates` when that list is given, else into the grads (as apex does).
struct LambStage1Functor : FunctorBase<LambStage1Functor> {
  float beta1, beta2, beta3, epsilon, weight_decay;
  int mode;
  bool bias_correction;
  bool has_updates = false;
  ScalarArg step, global_grad_norm, max_grad_norm, inv_scale{1.f}, found_inf{0.f};
  const float* per_tensor_decay = nullptr;  // overrides weight_decay per tensor
  // Resolved per tensor by at_tensor.
  float bias_correction1 = 1.f, bias_correction2 = 1.f, clip = 1.f, decay = 0.f, unscale = 1.f;
  bool skipped = false;

  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2, 3}); }
  APEX_HD ListMask writes() const { return has_updates ? lists_mask({2, 3, 4}) : lists_mask({0, 2, 3}); }
  APEX_HD bool skip() const { return skipped; }
  APEX_HD LambStage1Functor at_tensor(int tensor) const {
    LambStage1Functor r = *this;
    const float norm = global_grad_norm.get(), max_norm = max_grad_norm.get();
    r.clip = norm > max_norm ? norm / max_norm : 1.f;
    r.decay = per_tensor_decay ? per_tensor_decay[tensor] : weight_decay;
    r.unscale = inv_scale.get();
    r.skipped = found_inf.get() != 0.f;
    if (bias_correction) {
      r.bias_correction1 = 1.f - pow_scalar(beta1, step.get());
      r.bias_correction2 = 1.f - pow_scalar(beta2, step.get());
    }
    return r;
  }
  template <class V>
  APEX_HD V update(V g, V p, V& m, V& v) const {
    V scaled = g * V(unscale) / V(clip);
    if (mode == kLambL2) scaled = scaled + V(decay) * p;
    m = m * V(beta1) + V(beta3) * scaled;
    v = v * V(beta2) + V(1.f - beta2) * scaled * scaled;
    V direction = (m / V(bias_correction1)) / (VecMath<V>::sqrt(v / V(bias_correction2)) + V(epsilon));
    if (mode == kLambDecoupled) direction = direction + V(decay) * p;
    return direction;
  }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m, V& v) const {
    g = update(g, p, m, v);
  }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m, V& v, V& out) const {
    out = update(g, p, m, v);
  }
};

// lists: [params, updates(, params_out)]
struct LambStage2Functor : FunctorBase<LambStage2Functor> {
  ScalarArg lr, found_inf{0.f};
  float weight_decay;
  bool use_nvlamb;
  const float* param_norms;
  const float* update_norms;
  float ratio = 0.f;
  bool skipped = false;

  APEX_HD ListMask reads() const { return lists_mask({0, 1}); }
  APEX_HD ListMask writes() const { return lists_mask({0, 2}); }
  APEX_HD bool skip() const { return skipped; }
  APEX_HD LambStage2Functor at_tensor(int tensor) const {
    LambStage2Functor r = *this;
    r.ratio = lr.get();
    // NVLAMB adapts every tensor; LAMB only those with weight decay.
    if (use_nvlamb || weight_decay != 0.f) {
      const float pn = param_norms[tensor], un = update_norms[tensor];
      if (pn != 0.f && un != 0.f) r.ratio *= pn / un;
    }
    r.skipped = found_inf.get() != 0.f;
    return r;
  }
  template <class V>
  APEX_HD void operator()(V& p, V& u) const {
    p = p - V(ratio) * u;
  }
  template <class V>
  APEX_HD void operator()(V& p, V& u, V& out) const {
    (*this)(p, u);
    out = p;
  }
};

inline LambStage1Functor lamb_stage1(double beta1, double beta2, double epsilon, bool bias_correction,
                                     bool grad_averaging, int64_t mode, double weight_decay) {
  APEX_CHECK(mode == kLambL2 || mode == kLambDecoupled, "multi_tensor_lamb: mode must be 0 (L2) or 1 (decoupled "
             "weight decay), got ", mode);
  LambStage1Functor op;
  op.beta1 = static_cast<float>(beta1);
  op.beta2 = static_cast<float>(beta2);
  op.beta3 = grad_averaging ? 1.f - op.beta1 : 1.f;
  op.bias_correction = bias_correction;
  op.epsilon = static_cast<float>(epsilon);
  op.weight_decay = static_cast<float>(weight_decay);
  op.mode = static_cast<int>(mode);
  return op;
}

inline LambStage2Functor lamb_stage2(const at::Tensor& param_norms, const at::Tensor& update_norms,
                                     double weight_decay, std::optional<bool> use_nvlamb) {
  LambStage2Functor op;
  op.weight_decay = static_cast<float>(weight_decay);
  op.use_nvlamb = use_nvlamb.value_or(false);
  op.param_norms = param_norms.data_ptr<float>();
  op.update_norms = update_norms.data_ptr<float>();
  return op;
}

inline void check_per_tensor(const char* op, const at::Tensor& x, const at::Tensor& flag, size_t count,
                             const char* what) {
  APEX_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.numel() == static_cast<int64_t>(count) &&
                 x.device() == flag.device(),
             op, ": ", what, " must be a contiguous float32 tensor of ", count, " elements on ", flag.device());
}

inline NormRequest per_tensor_norms() { return norm_request(true); }

template <class Engine>
void multi_tensor_lamb(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads, at::TensorList params,
                       at::TensorList exp_avgs, at::TensorList exp_avg_sqs, double lr, double beta1, double beta2,
                       double epsilon, int64_t step, int64_t bias_correction, double weight_decay,
                       int64_t grad_averaging, int64_t mode, const at::Tensor& global_grad_norm,
                       double max_grad_norm, std::optional<bool> use_nvlamb) {
  constexpr const char* kName = "multi_tensor_lamb";
  check_scalar_tensor(kName, global_grad_norm, noop_flag, "global_grad_norm", {at::kFloat});
  LambStage1Functor stage1 =
      lamb_stage1(beta1, beta2, epsilon, bias_correction == 1, grad_averaging == 1, mode, weight_decay);
  stage1.step.value = static_cast<float>(step);
  stage1.global_grad_norm.ptr = global_grad_norm.data_ptr<float>();
  stage1.max_grad_norm.value = static_cast<float>(max_grad_norm);

  const auto dtype = list_dtype(kName, params, "params");
  APEX_CHECK(list_dtype(kName, grads, "grads") == dtype, kName, ": grads must have the params' dtype");
  const auto state_dtype = list_dtype(kName, exp_avgs, "exp_avgs");
  APEX_CHECK(list_dtype(kName, exp_avg_sqs, "exp_avg_sqs") == state_dtype, kName,
             ": exp_avgs and exp_avg_sqs must share one dtype");
  dispatch_param_state(kName, dtype, state_dtype, [&](auto p, auto s) {
    using P = typename decltype(p)::type;
    using S = typename decltype(s)::type;
    const auto param_norms = std::get<1>(reduce_norm<Engine>(kName, chunk_size, noop_flag, params,
                                                             SquareFunctor<false>{}, per_tensor_norms()));
    Engine::template elementwise<TypeList<P, P, S, S>>(kName, chunk_size, noop_flag,
                                                       {grads, params, exp_avgs, exp_avg_sqs}, stage1);
    const auto update_norms = std::get<1>(reduce_norm<Engine>(kName, chunk_size, noop_flag, grads,
                                                              SquareFunctor<false>{}, per_tensor_norms()));
    LambStage2Functor stage2 = lamb_stage2(param_norms, update_norms, weight_decay, use_nvlamb);
    stage2.lr.value = static_cast<float>(lr);
    Engine::template elementwise<TypeList<P, P>>(kName, chunk_size, noop_flag, {params, grads}, stage2);
  });
}

template <class Engine>
void multi_tensor_lamb_mp(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads,
                          at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                          at::TensorList params_out, const at::Tensor& lr, double beta1, double beta2, double epsilon,
                          const at::Tensor& step, int64_t bias_correction, double weight_decay, int64_t grad_averaging,
                          int64_t mode, const at::Tensor& global_grad_norm, const at::Tensor& max_grad_norm,
                          std::optional<bool> use_nvlamb, const at::Tensor& found_inf, const at::Tensor& inv_scale) {
  constexpr const char* kName = "multi_tensor_lamb_mp";
  check_scalar_tensor(kName, lr, noop_flag, "lr", {at::kFloat, at::kDouble});
  check_scalar_tensor(kName, step, noop_flag, "step", {at::kInt, at::kLong, at::kFloat, at::kDouble});
  for (const auto* t : {&global_grad_norm, &max_grad_norm, &found_inf, &inv_scale}) {
    check_scalar_tensor(kName, *t, noop_flag, "global_grad_norm, max_grad_norm, found_inf and inv_scale each",
                        {at::kFloat});
  }
  for (auto list : {params, exp_avgs, exp_avg_sqs}) {
    APEX_CHECK(list_dtype(kName, list, "params/exp_avgs/exp_avg_sqs") == at::kFloat, kName,
               ": params (the fp32 master copy), exp_avgs and exp_avg_sqs must be float32");
  }
  // Stream-ordered device-side conversions: nothing synchronises, so CUDA graphs can capture them.
  const at::Tensor lr_f = lr.to(at::kFloat), step_f = step.to(at::kFloat);
  LambStage1Functor stage1 =
      lamb_stage1(beta1, beta2, epsilon, bias_correction == 1, grad_averaging == 1, mode, weight_decay);
  stage1.global_grad_norm.ptr = global_grad_norm.data_ptr<float>();
  stage1.max_grad_norm.ptr = max_grad_norm.data_ptr<float>();
  stage1.inv_scale.ptr = inv_scale.data_ptr<float>();
  stage1.found_inf.ptr = found_inf.data_ptr<float>();
  stage1.step.ptr = step_f.data_ptr<float>();

  const auto grad_dtype = list_dtype(kName, grads, "grads");
  if (!params_out.empty()) {
    APEX_CHECK(list_dtype(kName, params_out, "params_out") == grad_dtype, kName,
               ": params_out must have the grads' dtype");
  }
  dispatch_floating(grad_dtype, kName, "grads", [&](auto g) {
    using G = typename decltype(g)::type;
    const auto param_norms = std::get<1>(reduce_norm<Engine>(kName, chunk_size, noop_flag, params,
                                                             SquareFunctor<true>{}, per_tensor_norms()));
    Engine::template elementwise<TypeList<G, float, float, float>>(kName, chunk_size, noop_flag,
                                                                   {grads, params, exp_avgs, exp_avg_sqs}, stage1);
    const auto update_norms = std::get<1>(reduce_norm<Engine>(kName, chunk_size, noop_flag, grads,
                                                              SquareFunctor<true>{}, per_tensor_norms()));
    LambStage2Functor stage2 = lamb_stage2(param_norms, update_norms, weight_decay, use_nvlamb);
    stage2.lr.ptr = lr_f.data_ptr<float>();
    stage2.found_inf.ptr = found_inf.data_ptr<float>();
    if (params_out.empty()) {
      Engine::template elementwise<TypeList<float, G>>(kName, chunk_size, noop_flag, {params, grads}, stage2);
    } else {
      Engine::template elementwise<TypeList<float, G, G>>(kName, chunk_size, noop_flag, {params, grads, params_out},
                                                          stage2);
    }
  });
}

template <class Engine>
void multi_tensor_lamb_stage1(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads,
                              at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                              at::TensorList updates, const at::Tensor& per_tensor_decay, int64_t step, double beta1,
                              double beta2, double epsilon, const at::Tensor& global_grad_norm,
                              double max_global_grad_norm) {
  constexpr const char* kName = "multi_tensor_lamb_stage1";
  check_scalar_tensor(kName, global_grad_norm, noop_flag, "global_grad_norm", {at::kFloat});
  check_per_tensor(kName, per_tensor_decay, noop_flag, grads.size(), "per_tensor_decay");
  for (auto list : {params, exp_avgs, exp_avg_sqs, updates}) {
    APEX_CHECK(list_dtype(kName, list, "params/exp_avgs/exp_avg_sqs/updates") == at::kFloat, kName,
               ": params, exp_avgs, exp_avg_sqs and updates must be float32");
  }
  // apex's first LAMB: bias correction always on, (1 - beta1) averaging, per-tensor decoupled decay.
  LambStage1Functor op = lamb_stage1(beta1, beta2, epsilon, true, true, kLambDecoupled, 0.0);
  op.step.value = static_cast<float>(step);
  op.per_tensor_decay = per_tensor_decay.data_ptr<float>();
  op.global_grad_norm.ptr = global_grad_norm.data_ptr<float>();
  op.max_grad_norm.value = static_cast<float>(max_global_grad_norm);
  op.has_updates = true;
  dispatch_floating(list_dtype(kName, grads, "grads"), kName, "grads", [&](auto g) {
    using G = typename decltype(g)::type;
    Engine::template elementwise<TypeList<G, float, float, float, float>>(
        kName, chunk_size, noop_flag, {grads, params, exp_avgs, exp_avg_sqs, updates}, op);
  });
}

template <class Engine>
void multi_tensor_lamb_stage2(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList params,
                              at::TensorList updates, const at::Tensor& per_tensor_param_norm,
                              const at::Tensor& per_tensor_update_norm, double lr, double weight_decay,
                              std::optional<bool> use_nvlamb) {
  constexpr const char* kName = "multi_tensor_lamb_stage2";
  check_per_tensor(kName, per_tensor_param_norm, noop_flag, params.size(), "per_tensor_param_norm");
  check_per_tensor(kName, per_tensor_update_norm, noop_flag, params.size(), "per_tensor_update_norm");
  APEX_CHECK(list_dtype(kName, updates, "updates") == at::kFloat, kName, ": updates must be float32");
  LambStage2Functor op = lamb_stage2(per_tensor_param_norm, per_tensor_update_norm, weight_decay, use_nvlamb);
  op.lr.value = static_cast<float>(lr);
  dispatch_floating(list_dtype(kName, params, "params"), kName, "params", [&](auto p) {
    using P = typename decltype(p)::type;
    Engine::template elementwise<TypeList<P, float>>(kName, chunk_size, noop_flag, {params, updates}, op);
  });
}

// Registers this file's ops for the dispatch key of `m` (CPU or CUDA), run by `Engine`.
template <class Engine>
void register_lamb_kernels(torch::Library& m) {
  m.impl("multi_tensor_lamb", &multi_tensor_lamb<Engine>);
  m.impl("multi_tensor_lamb_mp", &multi_tensor_lamb_mp<Engine>);
  m.impl("multi_tensor_lamb_stage1", &multi_tensor_lamb_stage1<Engine>);
  m.impl("multi_tensor_lamb_stage2", &multi_tensor_lamb_stage2<Engine>);
}

}  // namespace apex::multi_tensor
