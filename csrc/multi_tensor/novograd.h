// multi_tensor_novograd: NovoGrad, whose second moment is one number per tensor, the blended
// norm of its gradient (L2 or L-inf), kept in grad_norms (float32 [ntensors], updated in place).
#pragma once

#include <torch/library.h>

#include "apex/multi_tensor_apply_common.h"
#include "l2norm.h"

namespace apex::multi_tensor {

enum NovogradMode : int { kNovogradL2 = 0, kNovogradDecoupled = 1 };

// lists: [grads, params, exp_avgs]
struct NovogradFunctor : FunctorBase<NovogradFunctor> {
  float lr, beta1, beta3, bias_correction1, bias_correction2, epsilon, weight_decay;
  int mode;
  const float* grad_norms;
  float grad_norm = 0.f;  // of the tensor at hand, set by at_tensor

  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2}); }
  APEX_HD ListMask writes() const { return lists_mask({1, 2}); }
  APEX_HD NovogradFunctor at_tensor(int tensor) const {
    NovogradFunctor r = *this;
    r.grad_norm = grad_norms[tensor];
    return r;
  }
  template <class V>
  APEX_HD void operator()(V& g, V& p, V& m) const {
    const V denom = V(grad_norm / bias_correction2 + epsilon);
    if (mode == kNovogradL2) {
      const V scaled = g / denom + V(weight_decay) * p;
      m = V(beta1) * m + V(beta3) * scaled;
      p = p - V(lr) * (m / V(bias_correction1));
    } else {
      m = V(beta1) * m + V(beta3) * g;
      p = p - V(lr) * ((m / V(bias_correction1)) / denom + V(weight_decay) * p);
    }
  }
};

template <class Engine>
void multi_tensor_novograd(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList grads,
                           at::TensorList params, at::TensorList exp_avgs, const at::Tensor& grad_norms, double lr,
                           double beta1, double beta2, double epsilon, int64_t step, int64_t bias_correction,
                           double weight_decay, int64_t grad_averaging, int64_t mode, int64_t norm_type) {
  constexpr const char* kName = "multi_tensor_novograd";
  APEX_CHECK(mode == kNovogradL2 || mode == kNovogradDecoupled, kName, ": mode must be 0 or 1, got ", mode);
  APEX_CHECK(norm_type == 0 || norm_type == 2, kName, ": norm_type must be 0 (L-inf) or 2 (L2), got ", norm_type);
  // grad_norms[t] <- blend of its old value and this step's norm of grads[t], weights beta2 and 1 - beta2.
  NormRequest request;
  request.per_tensor = norm_type == 2 ? PerTensorOut::kBlendL2 : PerTensorOut::kBlendMax;
  request.blend_into = grad_norms;
  request.keep = static_cast<float>(beta2);
  request.take = 1.f - static_cast<float>(beta2);
  if (norm_type == 2) {
    reduce_norm<Engine>(kName, chunk_size, noop_flag, grads, SquareFunctor<false>{}, request);
  } else {
    reduce_norm<Engine>(kName, chunk_size, noop_flag, grads, AbsMaxFunctor{}, request);
  }

  NovogradFunctor op;
  op.lr = static_cast<float>(lr);
  op.beta1 = static_cast<float>(beta1);
  op.beta3 = grad_averaging == 1 ? 1.f - op.beta1 : 1.f;
  op.bias_correction1 = bias_correction == 1 ? 1.f - pow_scalar(op.beta1, static_cast<float>(step)) : 1.f;
  op.bias_correction2 =
      bias_correction == 1 ? std::sqrt(1.f - pow_scalar(static_cast<float>(beta2), static_cast<float>(step))) : 1.f;
  op.epsilon = static_cast<float>(epsilon);
  op.weight_decay = static_cast<float>(weight_decay);
  op.mode = static_cast<int>(mode);
  op.grad_norms = grad_norms.data_ptr<float>();
  const auto dtype = list_dtype(kName, params, "params");
  APEX_CHECK(list_dtype(kName, grads, "grads") == dtype && list_dtype(kName, exp_avgs, "exp_avgs") == dtype, kName,
             ": grads, params and exp_avgs must share one dtype");
  dispatch_floating(dtype, kName, "params", [&](auto p) {
    using T = typename decltype(p)::type;
    Engine::template elementwise<TypeList<T, T, T>>(kName, chunk_size, noop_flag, {grads, params, exp_avgs}, op);
  });
}

// Registers this file's ops for the dispatch key of `m` (CPU or CUDA), run by `Engine`.
template <class Engine>
void register_novograd_kernels(torch::Library& m) {
  m.impl("multi_tensor_novograd", &multi_tensor_novograd<Engine>);
}

}  // namespace apex::multi_tensor
