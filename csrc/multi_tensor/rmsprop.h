// multi_tensor_rmsprop: RMSprop as torch.optim.RMSprop computes it, and as TensorFlow does
// (timm's RMSpropTF: eps inside the square root, decay decoupled or not, lr inside the momentum
// buffer), with momentum and centering; one functor for both.
#pragma once

#include "apex/multi_tensor_kernel.h"

namespace apex::multi_tensor {

// lists: [grads, params, square_avgs, momentum_buffers, grad_avgs]; the last two are left out
// (null) without momentum / centering.
struct RmspropFunctor : FunctorBase<RmspropFunctor> {
  float lr = 0.01f, alpha = 0.99f, epsilon = 1e-8f, weight_decay = 0.f, momentum = 0.f;
  bool centered = false;
  bool tf_style = false;         // square_avg += (1 - alpha)(g^2 - square_avg); sqrt(. + eps)
  bool decoupled_decay = false;  // (TF) p *= 1 - lr * weight_decay instead of g += weight_decay * p
  bool lr_in_momentum = true;    // (TF) buf = momentum * buf + lr * g / avg; p -= buf

  APEX_HD ListMask reads() const {
    return lists_mask({0, 1, 2}) | (momentum > 0.f ? lists_mask({3}) : 0) | (centered ? lists_mask({4}) : 0);
  }
  APEX_HD ListMask writes() const {
    return lists_mask({1, 2}) | (momentum > 0.f ? lists_mask({3}) : 0) | (centered ? lists_mask({4}) : 0);
  }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& square_avg, V& buf, V& grad_avg) const {
    V grad = g;
    if (weight_decay != 0.f) {
      if (decoupled_decay) {
        p = p * V(1.f - lr * weight_decay);
      } else {
        grad = grad + V(weight_decay) * p;
      }
    }
    if (tf_style) {
      square_avg = square_avg + V(1.f - alpha) * (grad * grad - square_avg);
    } else {
      square_avg = V(alpha) * square_avg + V(1.f - alpha) * grad * grad;
    }
    V variance = square_avg;
    if (centered) {
      grad_avg = grad_avg + V(1.f - alpha) * (grad - grad_avg);
      variance = square_avg - grad_avg * grad_avg;
    }
    const V avg = tf_style ? VecMath<V>::sqrt(variance + V(epsilon)) : VecMath<V>::sqrt(variance) + V(epsilon);
    if (momentum > 0.f) {
      if (lr_in_momentum) {
        buf = V(momentum) * buf + V(lr) * grad / avg;
        p = p - buf;
      } else {
        buf = V(momentum) * buf + grad / avg;
        p = p - V(lr) * buf;
      }
    } else {
      p = p - V(lr) * grad / avg;
    }
  }
};

void rmsprop(const Cpu&, const TensorLists& lists, int* flag, const RmspropFunctor& op);
void rmsprop(const Cuda&, const TensorLists& lists, int* flag, const RmspropFunctor& op);

template <class Engine, class Device>
void run_rmsprop(const Device& device, const TensorLists& lists, int* flag, const RmspropFunctor& op) {
  dispatch_param_state(lists.dtypes[1], lists.dtypes[2], [&](auto p, auto s) {
    using P = TypeOf<decltype(p)>;
    using S = TypeOf<decltype(s)>;
    Engine::template elementwise<TypeList<P, P, S, S, S>>(device, lists, flag, op);
  });
}

}  // namespace apex::multi_tensor
