// Adam / AdamW, one functor for every entry point: multi_tensor_adam (scalars from the host),
// multi_tensor_adam_capturable(_master) (lr, step counts and the grad scaler's inv_scale read from
// tensors, so a CUDA graph can replay the step; skipped while the flag is set; with master
// params the step runs on fp32 copies and the model params receive it rounded) and
// multi_tensor_bert_adam (BertAdam: no bias correction, grads clipped by their norm, a warmup
// schedule of the lr computed from the step count on the device).
#pragma once

#include "apex/multi_tensor_kernel.h"

namespace apex::multi_tensor {

enum AdamMode : int { kAdamL2 = 0, kAdamDecoupled = 1 };  // apex's ADAM_MODE_0 (Adam) / ADAM_MODE_1 (AdamW)

// BertAdam's learning-rate schedules of x = progress through t_total steps (pytorch-pretrained-BERT).
enum class LrSchedule : int { kNone = 0, kWarmupLinear, kWarmupCosine, kWarmupConstant, kWarmupPoly };

// pytorch-pretrained-BERT's warmup_poly degree.
constexpr float kWarmupPolyDegree = 0.5f;
// BertAdam's clip: grads * max_norm / (norm + kClipEpsilon) when that is below 1.
constexpr float kClipEpsilon = 1e-6f;
constexpr float kPi = 3.14159265358979323846f;

APEX_HD inline float lr_schedule_factor(LrSchedule schedule, float x, float warmup) {
  if (schedule == LrSchedule::kNone) return 1.f;
  if (x < warmup) return x / warmup;
  switch (schedule) {
    case LrSchedule::kWarmupLinear: return ScalarMath<float>::max((x - 1.f) / (warmup - 1.f), 0.f);
    case LrSchedule::kWarmupCosine: return 0.5f * (1.f + cos_scalar(kPi * x));
    case LrSchedule::kWarmupConstant: return 1.f;
    case LrSchedule::kWarmupPoly: return pow_scalar(1.f - x, kWarmupPolyDegree);
    default: return 1.f;
  }
}

struct AdamArgs {
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f, weight_decay = 0.f;
  int mode = kAdamDecoupled;
  bool bias_correction = true;
  ScalarArg lr, step, inv_scale{1.f};  // step: one count, or one per tensor
  bool skip_if_flag_set = false;       // amp's found_inf, copied into the flag, skips the step
  bool unscale_grads = false;          // write the unscaled (clipped) grads back, as apex's capturable Adam
  ScalarArg grad_norm;                 // BertAdam: grads * min(1, max_grad_norm / (grad_norm + 1e-6))
  float max_grad_norm = 0.f;           // <= 0: no clipping
  LrSchedule schedule = LrSchedule::kNone;
  float warmup = 0.f, t_total = 1.f;   // the schedule's x is (step - 1) / t_total
};

// lists: [grads, params, exp_avgs, exp_avg_sqs(, master_params)]
struct AdamFunctor : FunctorBase<AdamFunctor> {
  AdamArgs a;
  bool has_master = false;
  // Resolved per tensor by at_tensor.
  float lr = 0.f, bias_correction1 = 1.f, bias_correction2 = 1.f, grad_scale = 1.f;

  // With master params the model params are only written.
  APEX_HD ListMask reads() const { return has_master ? lists_mask({0, 2, 3, 4}) : lists_mask({0, 1, 2, 3}); }
  APEX_HD ListMask writes() const {
    const ListMask grads = a.unscale_grads && grad_scale != 1.f ? lists_mask({0}) : 0;
    return grads | (has_master ? lists_mask({1, 2, 3, 4}) : lists_mask({1, 2, 3}));
  }
  APEX_HD bool skip_if_flag_set() const { return a.skip_if_flag_set; }

  APEX_HD AdamFunctor at_tensor(int64_t tensor) const {
    AdamFunctor r = *this;
    const float step = a.step.get(tensor);
    r.lr = a.lr.get() * lr_schedule_factor(a.schedule, (step - 1.f) / a.t_total, a.warmup);
    if (a.bias_correction) {
      r.bias_correction1 = 1.f - pow_scalar(a.beta1, step);
      r.bias_correction2 = 1.f - pow_scalar(a.beta2, step);
    }
    r.grad_scale = a.inv_scale.get();
    if (a.max_grad_norm > 0.f) {
      const float clip = a.max_grad_norm / (a.grad_norm.get() + kClipEpsilon);
      if (clip < 1.f) r.grad_scale *= clip;
    }
    return r;
  }

  // One Adam step of one element, in apex's order of operations.
  template <class V>
  APEX_HD void update(V g, V& p, V& m, V& v) const {
    if (a.mode == kAdamL2) g = g + V(a.weight_decay) * p;
    m = V(a.beta1) * m + V(1.f - a.beta1) * g;
    v = V(a.beta2) * v + V(1.f - a.beta2) * g * g;
    const V denom = VecMath<V>::sqrt(v / V(bias_correction2)) + V(a.epsilon);
    V step = (m / V(bias_correction1)) / denom;
    if (a.mode == kAdamDecoupled) step = step + V(a.weight_decay) * p;
    p = p - V(lr) * step;
  }

  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m, V& v) const {
    g = g * V(grad_scale);
    update(g, p, m, v);
  }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m, V& v, V& master) const {
    g = g * V(grad_scale);
    update(g, master, m, v);
    p = master;
  }
};

void adam(const Cpu&, const TensorLists& lists, int* flag, const AdamFunctor& op);
void adam(const Cuda&, const TensorLists& lists, int* flag, const AdamFunctor& op);

template <class Engine, class Device>
void run_adam(const Device& device, const TensorLists& lists, int* flag, const AdamFunctor& op) {
  dispatch_param_state<true>(lists.dtypes[1], lists.dtypes[2], [&](auto p, auto s) {
    using P = TypeOf<decltype(p)>;
    using S = TypeOf<decltype(s)>;
    if (!op.has_master) {
      Engine::template elementwise<TypeList<P, P, S, S>>(device, lists, flag, op);
    } else if constexpr (kIsReduced<P> && std::is_same_v<S, float>) {
      Engine::template elementwise<TypeList<P, P, S, S, S>>(device, lists, flag, op);
    }
  });
}

}  // namespace apex::multi_tensor
