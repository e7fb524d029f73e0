// multi_tensor_lars: LARS (You et al., "Large Batch Training of Convolutional Networks") as ROCm
// apex's FusedLARS computes it: SGD with momentum whose lr is scaled per tensor by the trust ratio
//   trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)   (1 if a norm is 0),
// the norms given per tensor (multi_tensor_l2norm's). Skipped while the flag is set.
#pragma once

#include "apex/multi_tensor_kernel.h"
#include "sgd.h"

namespace apex::multi_tensor {

// lists: [grads, weights, momentum_buffers(, weights_out)]
struct LarsFunctor : FunctorBase<LarsFunctor> {
  float lr = 0.f, trust_coefficient = 0.001f, epsilon = 0.f, weight_decay = 0.f, momentum = 0.f;
  bool nesterov = false;
  bool is_skipped = false;  // the group opts out of the trust ratio (ROCm's is_skipped)
  bool has_copy = false;
  const float* grad_norms = nullptr;
  const float* param_norms = nullptr;
  float scaled_lr = 0.f;  // resolved per tensor by at_tensor

  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2}); }
  APEX_HD ListMask writes() const { return has_copy ? lists_mask({1, 2, 3}) : lists_mask({1, 2}); }
  APEX_HD bool skip_if_flag_set() const { return true; }
  APEX_HD LarsFunctor at_tensor(int64_t tensor) const {
    LarsFunctor r = *this;
    float trust_ratio = 1.f;
    const float param_norm = param_norms[tensor], grad_norm = grad_norms[tensor];
    if (param_norm > 0.f && grad_norm > 0.f) {
      trust_ratio = trust_coefficient * param_norm / (grad_norm + param_norm * weight_decay + epsilon);
    }
    r.scaled_lr = is_skipped ? lr : lr * trust_ratio;
    return r;
  }
  template <class V>
  APEX_HD void operator()(V& g, V& w, V& mom) const {
    const V grad = g + V(weight_decay) * w;
    mom = mom * V(momentum) - V(scaled_lr) * grad;
    w = nesterov ? w + mom * V(momentum) - V(scaled_lr) * grad : w + mom;
  }
  template <class V>
  APEX_HD void operator()(V& g, V& w, V& mom, V& w_out) const {
    (*this)(g, w, mom);
    w_out = w;
  }
};

void lars(const Cpu&, const TensorLists& lists, int* flag, const LarsFunctor& op);
void lars(const Cuda&, const TensorLists& lists, int* flag, const LarsFunctor& op);

}  // namespace apex::multi_tensor
