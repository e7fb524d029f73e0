// multi_tensor_adagrad: Adagrad with L2 (mode 0) or decoupled (mode 1) weight decay.
#pragma once

#include "apex/multi_tensor_kernel.h"

namespace apex::multi_tensor {

enum AdagradMode : int { kAdagradL2 = 0, kAdagradDecoupled = 1 };

// lists: [grads, params, state_sums]
struct AdagradFunctor : FunctorBase<AdagradFunctor> {
  float lr = 0.f, epsilon = 1e-10f, weight_decay = 0.f;
  int mode = kAdagradL2;
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

void adagrad(const Cpu&, const TensorLists& lists, int* flag, const AdagradFunctor& op);
void adagrad(const Cuda&, const TensorLists& lists, int* flag, const AdagradFunctor& op);

template <class Engine, class Device>
void run_adagrad(const Device& device, const TensorLists& lists, int* flag, const AdagradFunctor& op) {
  dispatch_param_state(lists.dtypes[1], lists.dtypes[2], [&](auto p, auto s) {
    using P = TypeOf<decltype(p)>;
    using S = TypeOf<decltype(s)>;
    Engine::template elementwise<TypeList<P, P, S>>(device, lists, flag, op);
  });
}

}  // namespace apex::multi_tensor
