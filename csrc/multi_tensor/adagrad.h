// multi_tensor_adagrad: Adagrad with L2 (mode 0) or decoupled (mode 1) weight decay.
#pragma once

#include <torch/library.h>

#include "apex/multi_tensor_apply_common.h"

namespace apex::multi_tensor {

enum AdagradMode : int { kAdagradL2 = 0, kAdagradDecoupled = 1 };

// lists: [grads, params, state_sums]
struct AdagradFunctor : FunctorBase<AdagradFunctor> {
  float lr, epsilon, weight_decay;
  int mode;
  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2}); }
  APEX_HD ListMask writes() const { return lists_mask({1, 2}); }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& h) const {
    V grad = g;
    if (mode == kAdagradL2) grad = grad + V(weight_decay) * p;
    h = h + grad * grad;
    V step = grad / (VecMath<V>::sqrt(h) + V(epsilon));
    if (mode == kAdagradDecoupled) step = step + V(weight_decay) * p;
    p = p - V(lr) * step;
  }
};

template <class Engine>
void multi_tensor_adagrad(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads,
                          at::TensorList params, at::TensorList state_sums, double lr, double epsilon, int64_t mode,
                          double weight_decay) {
  constexpr const char* kName = "multi_tensor_adagrad";
  APEX_CHECK(mode == kAdagradL2 || mode == kAdagradDecoupled, kName, ": mode must be 0 (L2) or 1 (decoupled), got ",
             mode);
  AdagradFunctor op;
  op.lr = static_cast<float>(lr);
  op.epsilon = static_cast<float>(epsilon);
  op.weight_decay = static_cast<float>(weight_decay);
  op.mode = static_cast<int>(mode);
  const auto dtype = list_dtype(kName, params, "params");
  APEX_CHECK(list_dtype(kName, grads, "grads") == dtype, kName, ": grads must have the params' dtype");
  dispatch_param_state(kName, dtype, list_dtype(kName, state_sums, "state_sums"), [&](auto p, auto s) {
    using P = typename decltype(p)::type;
    using S = typename decltype(s)::type;
    Engine::template elementwise<TypeList<P, P, S>>(kName, chunk_size, noop_flag, {grads, params, state_sums}, op);
  });
}

// Registers this file's ops for the dispatch key of `m` (CPU or CUDA), run by `Engine`.
template <class Engine>
void register_adagrad_kernels(torch::Library& m) {
  m.impl("multi_tensor_adagrad", &multi_tensor_adagrad<Engine>);
}

}  // namespace apex::multi_tensor
