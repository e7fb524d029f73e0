// multi_tensor_sgd: SGD with momentum, dampening, Nesterov and weight decay before or after
// momentum, on grads multiplied by `scale` (amp's unscale fused in). An optional fourth list
// receives a reduced-precision copy of the updated fp32 weights. Skipped while the flag is set.
#pragma once

#include <torch/library.h>

#include "apex/multi_tensor_apply_common.h"

namespace apex::multi_tensor {

// lists: [grads, weights, momentum_buffers(, weights_out)]
struct SgdFunctor : FunctorBase<SgdFunctor> {
  static constexpr bool kSkipIfFlagSet = true;
  float weight_decay, momentum, dampening, lr, scale;
  bool nesterov, first_run, weight_decay_after_momentum;

  APEX_HD ListMask reads() const {
    return momentum != 0.f && !first_run ? lists_mask({0, 1, 2}) : lists_mask({0, 1});
  }
  APEX_HD ListMask writes() const { return momentum != 0.f ? lists_mask({1, 2, 3}) : lists_mask({1, 3}); }

  template <class V>
  APEX_HD void operator()(V& g, V& w, V& mom) const {
    V grad = g * V(scale);
    if (weight_decay != 0.f && !weight_decay_after_momentum) grad = grad + V(weight_decay) * w;
    if (momentum != 0.f) {
      // The first step seeds the momentum buffer with the gradient itself.
      mom = first_run ? grad : mom * V(momentum) + V(1.f - dampening) * grad;
      grad = nesterov ? grad + V(momentum) * mom : mom;
    }
    if (weight_decay != 0.f && weight_decay_after_momentum) grad = grad + V(weight_decay) * w;
    w = w - V(lr) * grad;
  }
  template <class V>
  APEX_HD void operator()(V& g, V& w, V& mom, V& w_out) const {
    (*this)(g, w, mom);
    w_out = w;
  }
};

template <class Engine>
void multi_tensor_sgd(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads, at::TensorList weights,
                      at::TensorList momentum_buffers, at::TensorList weights_out, double weight_decay,
                      double momentum, double dampening, double lr, bool nesterov, bool first_run,
                      bool weight_decay_after_momentum, double scale) {
  constexpr const char* kName = "multi_tensor_sgd";
  SgdFunctor op;
  op.weight_decay = static_cast<float>(weight_decay);
  op.momentum = static_cast<float>(momentum);
  op.dampening = static_cast<float>(dampening);
  op.lr = static_cast<float>(lr);
  op.scale = static_cast<float>(scale);
  op.nesterov = nesterov;
  op.first_run = first_run;
  op.weight_decay_after_momentum = weight_decay_after_momentum;

  const auto weight_dtype = list_dtype(kName, weights, "weights");
  APEX_CHECK(list_dtype(kName, momentum_buffers, "momentum_buffers") == weight_dtype, kName,
             ": momentum buffers must have the weights' dtype");
  // apex's combinations: grads in the weights' dtype or 16-bit grads on fp32 weights, and for the
  // 4-list form fp32 weights/momentum plus a copy in the grads' dtype (or 16-bit from fp32 grads).
  const auto grad_dtype = list_dtype(kName, grads, "grads");
  if (weights_out.empty()) {
    dispatch_param_state(kName, grad_dtype, weight_dtype, [&](auto g, auto w) {
      using G = typename decltype(g)::type;
      using W = typename decltype(w)::type;
      Engine::template elementwise<TypeList<G, W, W>>(kName, chunk_size, noop_flag, {grads, weights, momentum_buffers},
                                                      op);
    });
    return;
  }
  APEX_CHECK(weight_dtype == at::kFloat, kName, ": with a weights_out list the weights must be float32");
  dispatch_param_state(kName, list_dtype(kName, weights_out, "weights_out"), grad_dtype, [&](auto o, auto g) {
    using O = typename decltype(o)::type;
    using G = typename decltype(g)::type;
    Engine::template elementwise<TypeList<G, float, float, O>>(kName, chunk_size, noop_flag,
                                                               {grads, weights, momentum_buffers, weights_out}, op);
  });
}

// Registers this file's ops for the dispatch key of `m` (CPU or CUDA), run by `Engine`.
template <class Engine>
void register_sgd_kernels(torch::Library& m) {
  m.impl("multi_tensor_sgd", &multi_tensor_sgd<Engine>);
}

}  // namespace apex::multi_tensor
