// multi_tensor_adadelta: Adadelta as torch.optim.Adadelta computes it.
#pragma once

#include "apex/multi_tensor_kernel.h"

namespace apex::multi_tensor {

// lists: [grads, params, square_avgs, acc_deltas]
struct AdadeltaFunctor : FunctorBase<AdadeltaFunctor> {
  float lr = 1.f, rho = 0.9f, epsilon = 1e-6f, weight_decay = 0.f;
  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2, 3}); }
  APEX_HD ListMask writes() const { return lists_mask({1, 2, 3}); }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& square_avg, V& acc_delta) const {
    V grad = g;
    if (weight_decay != 0.f) grad = grad + V(weight_decay) * p;
    square_avg = V(rho) * square_avg + V(1.f - rho) * grad * grad;
    const V std = VecMath<V>::sqrt(square_avg + V(epsilon));
    const V delta = VecMath<V>::sqrt(acc_delta + V(epsilon)) / std * grad;
    acc_delta = V(rho) * acc_delta + V(1.f - rho) * delta * delta;
    p = p - V(lr) * delta;
  }
};

void adadelta(const Cpu&, const TensorLists& lists, int* flag, const AdadeltaFunctor& op);
void adadelta(const Cuda&, const TensorLists& lists, int* flag, const AdadeltaFunctor& op);

template <class Engine, class Device>
void run_adadelta(const Device& device, const TensorLists& lists, int* flag, const AdadeltaFunctor& op) {
  dispatch_param_state(lists.dtypes[1], lists.dtypes[2], [&](auto p, auto s) {
    using P = TypeOf<decltype(p)>;
    using S = TypeOf<decltype(s)>;
    Engine::template elementwise<TypeList<P, P, S, S>>(device, lists, flag, op);
  });
}

}  // namespace apex::multi_tensor
