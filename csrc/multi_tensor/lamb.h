// LAMB: one step (multi_tensor_lamb, multi_tensor_lamb_mp and the optimizers' multi_tensor_lamb_step),
// apex's older two-stage API (multi_tensor_lamb_stage1_cuda / _stage2_cuda) and the direction alone
// (multi_tensor_lamb_direction, stage 1 with every option):
//   stage 1: Adam-style moments on grads clipped by the global grad norm -> update
//   stage 2: p -= lr * trust_ratio * update, trust_ratio = ||p|| / ||update|| per tensor
// A step is two passes over the lists (the global grad norm is the caller's):
//   1. stats: the moments, and per tensor ||p||^2 and ||update||^2 (the update is not stored);
//   2. apply: the update again, from the new moments and p, and p -= lr * trust_ratio * update.
// Against apex's four passes (param norms; moments with the update written into the grads; update
// norms; apply) that is 40 instead of 48 bytes per fp32 param, and the update is never rounded to
// the grads' dtype. The grads are left as they were.
#pragma once

#include <limits>

#include "apex/multi_tensor_kernel.h"
#include "dtype_units.h"

namespace apex::multi_tensor {

enum LambMode : int { kLambL2 = 0, kLambDecoupled = 1 };  // weight decay in the moments, or on the update

// Which tensors the trust ratio scales.
enum class Trust : int {
  kDecayed = 0,  // LAMB (NVIDIA apex): tensors with weight decay
  kAll = 1,      // NVLAMB (use_nvlamb), and Lamb (You et al.; Ascend's NpuFusedLamb)
  kNone = 2,     // Lamb(adam=True): plain Adam steps, for comparison
};

struct LambArgs {
  float beta1 = 0.9f, beta2 = 0.999f, beta3 = 0.1f, epsilon = 1e-6f, weight_decay = 0.f;
  int mode = kLambDecoupled;
  bool bias_correction = true;
  ScalarArg lr, step, global_grad_norm, max_grad_norm, inv_scale{1.f}, found_inf{0.f};
  Trust trust = Trust::kDecayed;
  float max_param_norm = std::numeric_limits<float>::infinity();  // Lamb clamps ||p|| to 10
  const float* per_tensor_decay = nullptr;                         // stage-1 API: overrides weight_decay
  bool zero_norms_while_flag_set = false;                          // lamb_mp: then the trust ratio is 1
};

// The Adam half of LAMB, shared by the passes: the moments from a grad, the update from the moments.
struct LambMoments {
  LambArgs a;
  // Resolved per tensor by resolve().
  float bias_correction1 = 1.f, bias_correction2 = 1.f, clip = 1.f, decay = 0.f, unscale = 1.f;
  bool skipped = false;

  APEX_HD void resolve(int64_t tensor) {
    const float norm = a.global_grad_norm.get(), max_norm = a.max_grad_norm.get();
    clip = norm > max_norm ? norm / max_norm : 1.f;
    decay = a.per_tensor_decay ? a.per_tensor_decay[tensor] : a.weight_decay;
    unscale = a.inv_scale.get();
    skipped = a.found_inf.get() != 0.f;
    if (a.bias_correction) {
      const float step = a.step.get(tensor);
      bias_correction1 = 1.f - pow_scalar(a.beta1, step);
      bias_correction2 = 1.f - pow_scalar(a.beta2, step);
    }
  }
  template <class V>
  APEX_HD void accumulate(V g, V p, V& m, V& v) const {
    V scaled = g * V(unscale) / V(clip);
    if (a.mode == kLambL2) scaled = scaled + V(decay) * p;
    m = m * V(a.beta1) + V(a.beta3) * scaled;
    v = v * V(a.beta2) + V(1.f - a.beta2) * scaled * scaled;
  }
  template <class V>
  APEX_HD V update(V p, V m, V v) const {
    V direction = (m / V(bias_correction1)) / (VecMath<V>::sqrt(v / V(bias_correction2)) + V(a.epsilon));
    if (a.mode == kLambDecoupled) direction = direction + V(decay) * p;
    return direction;
  }
};

// The learning rate times the trust ratio of a tensor, from its norms.
struct LambTrust {
  ScalarArg lr;
  float weight_decay = 0.f;
  Trust trust = Trust::kDecayed;
  float max_param_norm = std::numeric_limits<float>::infinity();

  APEX_HD float step_size(float param_norm, float update_norm) const {
    float size = lr.get();
    if (trust == Trust::kAll || (trust == Trust::kDecayed && weight_decay != 0.f)) {
      const float pn = ScalarMath<float>::min(param_norm, max_param_norm);
      if (pn != 0.f && update_norm != 0.f) size *= pn / update_norm;
    }
    return size;
  }
};

// Per tensor, what the stats pass sums: ||p||^2 and ||update||^2.
constexpr int kLambSums = 2;

// Stats pass on [grads, params, exp_avgs, exp_avg_sqs]: the moments; returns the squares to sum.
struct LambStatsFunctor : FunctorBase<LambStatsFunctor>, LambMoments {
  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2, 3}); }
  APEX_HD ListMask writes() const { return lists_mask({2, 3}); }
  APEX_HD bool skip() const { return skipped; }
  APEX_HD LambStatsFunctor at_tensor(int64_t tensor) const {
    LambStatsFunctor r = *this;
    r.resolve(tensor);
    return r;
  }
  template <class V>
  APEX_HD Sums<V, kLambSums> operator()(V& g, V& p, V& m, V& v) const {
    accumulate(g, p, m, v);
    const V u = update(p, m, v);
    return {{p * p, u * u}};
  }
};

// Apply pass on [params, exp_avgs, exp_avg_sqs(, params_out)]: the update again, and the step.
struct LambApplyFunctor : FunctorBase<LambApplyFunctor>, LambMoments {
  LambTrust t;
  const float* sums = nullptr;           // [count][kLambSums] from the stats pass
  const int* zero_norms_flag = nullptr;  // lamb_mp: while this flag is set, the norms count as 0
  bool has_copy = false;
  float size = 0.f;  // resolved by at_tensor

  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2}); }
  APEX_HD ListMask writes() const { return has_copy ? lists_mask({0, 3}) : lists_mask({0}); }
  APEX_HD bool skip() const { return skipped; }
  APEX_HD LambApplyFunctor at_tensor(int64_t tensor) const {
    LambApplyFunctor r = *this;
    r.resolve(tensor);
    const bool zero = zero_norms_flag != nullptr && *zero_norms_flag != 0;
    r.size = t.step_size(zero ? 0.f : ScalarMath<float>::sqrt(sums[tensor * kLambSums]),
                         zero ? 0.f : ScalarMath<float>::sqrt(sums[tensor * kLambSums + 1]));
    return r;
  }
  template <class V>
  APEX_HD void operator()(V& p, V& m, V& v) const {
    p = p - V(size) * update(p, m, v);
  }
  template <class V>
  APEX_HD void operator()(V& p, V& m, V& v, V& out) const {
    (*this)(p, m, v);
    out = p;
  }
};

// The update direction on [grads, params, exp_avgs, exp_avg_sqs, updates]: the moments, and the
// update written out (apex's stage 1, multi_tensor_lamb_direction).
struct LambDirectionFunctor : FunctorBase<LambDirectionFunctor>, LambMoments {
  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2, 3}); }
  APEX_HD ListMask writes() const { return lists_mask({2, 3, 4}); }
  APEX_HD bool skip() const { return skipped; }
  APEX_HD LambDirectionFunctor at_tensor(int64_t tensor) const {
    LambDirectionFunctor r = *this;
    r.resolve(tensor);
    return r;
  }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m, V& v, V& out) const {
    accumulate(g, p, m, v);
    out = update(p, m, v);
  }
};

// apex's stage 2 on [params, updates], with the norms apex's multi_tensor_l2norm gave.
struct LambStage2Functor : FunctorBase<LambStage2Functor> {
  LambTrust t;
  ScalarArg found_inf{0.f};
  const float* param_norms = nullptr;
  const float* update_norms = nullptr;
  float size = 0.f;
  bool skipped = false;

  APEX_HD ListMask reads() const { return lists_mask({0, 1}); }
  APEX_HD ListMask writes() const { return lists_mask({0}); }
  APEX_HD bool skip() const { return skipped; }
  APEX_HD LambStage2Functor at_tensor(int64_t tensor) const {
    LambStage2Functor r = *this;
    r.size = t.step_size(param_norms[tensor], update_norms[tensor]);
    r.skipped = found_inf.get() != 0.f;
    return r;
  }
  template <class V>
  APEX_HD void operator()(V& p, V& u) const {
    p = p - V(size) * u;
  }
};

// Float32 memory on the kernels' device for one step: the stats' sums [count][kLambSums], and
// lamb_scratch() floats.
struct LambBuffers {
  float* sums;
  float* scratch;
};

inline int64_t lamb_scratch(const Cpu&, const TensorLists&) { return 0; }
inline int64_t lamb_scratch(const Cuda&, const TensorLists& lists) { return tensor_sums_scratch(lists, kLambSums); }

// A whole step on lists [grads, params, exp_avgs, exp_avg_sqs(, params_out)].
void lamb(const Cpu&, const TensorLists& lists, int* flag, const LambArgs& args, const LambBuffers& buffers);
void lamb(const Cuda&, const TensorLists& lists, int* flag, const LambArgs& args, const LambBuffers& buffers);
// The two-stage API: the direction (stage 1) on [grads, params, exp_avgs, exp_avg_sqs, updates]
// (fp32 but the grads), stage 2 on [params, updates] (fp32 updates).
void lamb_direction(const Cpu&, const TensorLists& lists, int* flag, const LambDirectionFunctor& op);
void lamb_direction(const Cuda&, const TensorLists& lists, int* flag, const LambDirectionFunctor& op);
void lamb_stage2(const Cpu&, const TensorLists& lists, int* flag, const LambStage2Functor& op);
void lamb_stage2(const Cuda&, const TensorLists& lists, int* flag, const LambStage2Functor& op);

inline LambTrust lamb_trust(const LambArgs& args) {
  LambTrust t;
  t.lr = args.lr;
  t.weight_decay = args.weight_decay;
  t.trust = args.trust;
  t.max_param_norm = args.max_param_norm;
  return t;
}

// Grads G, params P (G, or float32 master weights of 16-bit grads), states S (P or float32);
// params_out G. Params: the params dtypes that get kernels (dtype_units.h).
template <class Engine, class Params = AllDtypes, class Device>
void run_lamb(const Device& device, const TensorLists& lists, int* flag, const LambArgs& args,
              const LambBuffers& buffers) {
  LambStatsFunctor stats;
  stats.a = args;
  LambApplyFunctor apply;
  apply.a = args;
  apply.t = lamb_trust(args);
  apply.sums = buffers.sums;
  apply.zero_norms_flag = args.zero_norms_while_flag_set ? flag : nullptr;
  apply.has_copy = lists.has(4);
  std::vector<void*> storage;
  dispatch_floating<false>(lists.dtypes[0], [&](auto g) {
    using G = TypeOf<decltype(g)>;
    dispatch_param_state(lists.dtypes[1], lists.dtypes[2], [&](auto p, auto s) {
      using P = TypeOf<decltype(p)>;
      using S = TypeOf<decltype(s)>;
      if constexpr (Params::template kRuns<P> && (std::is_same_v<G, P> || std::is_same_v<P, float>)) {
        Engine::template tensor_sums<TypeList<G, P, S, S>, kLambSums>(device, lists.select({0, 1, 2, 3}, storage),
                                                                     stats, buffers.scratch, buffers.sums);
        if (apply.has_copy) {
          Engine::template elementwise<TypeList<P, S, S, G>>(device, lists.select({1, 2, 3, 4}, storage), flag, apply);
        } else {
          Engine::template elementwise<TypeList<P, S, S>>(device, lists.select({1, 2, 3}, storage), flag, apply);
        }
      }
    });
  });
}

template <class Engine, class Device>
void run_lamb_direction(const Device& device, const TensorLists& lists, int* flag, const LambDirectionFunctor& op) {
  dispatch_floating<false>(lists.dtypes[0], [&](auto g) {
    using G = TypeOf<decltype(g)>;
    Engine::template elementwise<TypeList<G, float, float, float, float>>(device, lists, flag, op);
  });
}

template <class Engine, class Device>
void run_lamb_stage2(const Device& device, const TensorLists& lists, int* flag, const LambStage2Functor& op) {
  dispatch_floating<false>(lists.dtypes[0], [&](auto p) {
    Engine::template elementwise<TypeList<TypeOf<decltype(p)>, float>>(device, lists, flag, op);
  });
}

}  // namespace apex::multi_tensor
