// multi_tensor_sgd: SGD with momentum, dampening, Nesterov and weight decay before or after
// momentum, on grads multiplied by `scale` (amp's unscale fused in). An optional fourth list
// receives a reduced-precision copy of the updated fp32 weights. Skipped while the flag is set.
#pragma once

#include "apex/multi_tensor_kernel.h"
#include "dtype_units.h"

namespace apex::multi_tensor {

// lists: [grads, weights, momentum_buffers(, weights_out)]
struct SgdFunctor : FunctorBase<SgdFunctor> {
  float weight_decay = 0.f, momentum = 0.f, dampening = 0.f, lr = 0.f, scale = 1.f;
  bool nesterov = false, first_run = false, weight_decay_after_momentum = false;
  bool has_copy = false;
  // 16-bit weights and momentum: every intermediate torch.optim.SGD keeps in a tensor is rounded
  // to their dtype where torch rounds it, so fp16 training follows torch's fp16 trajectory
  // (NVIDIA apex's tests compare the two within 1e-3).
  bool round_like_torch = false;
  Dtype weight_dtype = Dtype::kFloat32;
  // The `alpha` of each of torch's `x.add_(y, alpha=a)`: torch's CPU kernels round it to the
  // tensor's dtype first, its CUDA kernels keep it float (see sgd_alphas).
  float decay_alpha = 0.f, damping_alpha = 1.f, nesterov_alpha = 0.f, lr_alpha = 0.f;

  APEX_HD ListMask reads() const {
    return momentum != 0.f && !first_run ? lists_mask({0, 1, 2}) : lists_mask({0, 1});
  }
  APEX_HD ListMask writes() const {
    const ListMask copy = has_copy ? lists_mask({3}) : 0;
    return copy | (momentum != 0.f ? lists_mask({1, 2}) : lists_mask({1}));
  }
  APEX_HD bool skip_if_flag_set() const { return true; }

  template <class V>
  APEX_HD V rounded(V x) const {
    return round_like_torch ? VecMath<V>::round_to(x, weight_dtype) : x;
  }

  // torch.optim.SGD's sequence of in-place ops (each `x.add_(y, alpha=a)` a fused multiply-add).
  template <class V>
  APEX_HD void operator()(V& g, V& w, V& mom) const {
    using Math = VecMath<V>;
    V grad = g * V(scale);
    if (weight_decay != 0.f && !weight_decay_after_momentum) grad = rounded(Math::fma(w, V(decay_alpha), grad));
    if (momentum != 0.f) {
      // The first step seeds the momentum buffer with the gradient itself (torch.optim.SGD).
      mom = first_run ? grad : rounded(Math::fma(grad, V(damping_alpha), rounded(mom * V(momentum))));
      grad = nesterov ? rounded(Math::fma(mom, V(nesterov_alpha), grad)) : mom;
    }
    if (weight_decay != 0.f && weight_decay_after_momentum) grad = rounded(Math::fma(w, V(decay_alpha), grad));
    w = Math::fma(grad, V(lr_alpha), w);
  }
  template <class V>
  APEX_HD void operator()(V& g, V& w, V& mom, V& w_out) const {
    (*this)(g, w, mom);
    w_out = w;
  }
};

// Sets op's alphas from its settings; `round` (torch's CPU kernels with 16-bit weights) rounds
// each to the weights' dtype.
inline void sgd_alphas(SgdFunctor& op, bool round) {
  const auto alpha = [&](float a) { return round ? ScalarMath<float>::round_to(a, op.weight_dtype) : a; };
  op.decay_alpha = alpha(op.weight_decay);
  op.damping_alpha = alpha(1.f - op.dampening);
  op.nesterov_alpha = alpha(op.momentum);
  op.lr_alpha = alpha(-op.lr);
}

void sgd(const Cpu&, const TensorLists& lists, int* flag, const SgdFunctor& op);
void sgd(const Cuda&, const TensorLists& lists, int* flag, const SgdFunctor& op);

// The lists of SGD-like steps (SGD, LARS) [grads, weights, momentum_buffers(, weights_out)] in
// apex's combinations: grads in the weights' dtype or 16-bit grads on fp32 weights, and for the
// 4-list form fp32 weights and momentum plus a copy in the grads' dtype (any dtype from fp32 grads).
// Grads: the grads dtypes that get kernels (dtype_units.h).
template <class Engine, class Grads = AllDtypes, class Device, class Op>
void run_momentum_step(const Device& device, const TensorLists& lists, int* flag, const Op& op) {
  dispatch_param_state(lists.dtypes[0], lists.dtypes[1], [&](auto g, auto w) {
    using G = TypeOf<decltype(g)>;
    using W = TypeOf<decltype(w)>;
    if constexpr (!Grads::template kRuns<G>) {
      return;
    } else if (!op.has_copy) {
      Engine::template elementwise<TypeList<G, W, W>>(device, lists, flag, op);
    } else if constexpr (std::is_same_v<W, float>) {
      // The copy has the grads' dtype, or any dtype when the grads are float32.
      dispatch_floating<false>(lists.dtypes[3], [&](auto out) {
        using O = TypeOf<decltype(out)>;
        if constexpr (std::is_same_v<O, G> || std::is_same_v<G, float>) {
          Engine::template elementwise<TypeList<G, float, float, O>>(device, lists, flag, op);
        }
      });
    }
  });
}

}  // namespace apex::multi_tensor
