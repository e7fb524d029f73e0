// multi_tensor_novograd: NovoGrad, whose second moment is one number per tensor, the blended
// norm of its gradient (L2 or L-inf), kept in grad_norms (float32 [ntensors], updated in place).
#pragma once

#include "apex/multi_tensor_kernel.h"
#include "l2norm.h"

namespace apex::multi_tensor {

enum NovogradMode : int { kNovogradL2 = 0, kNovogradDecoupled = 1 };

// lists: [grads, params, exp_avgs]
struct NovogradFunctor : FunctorBase<NovogradFunctor> {
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.999f, beta3 = 0.1f, epsilon = 1e-8f, weight_decay = 0.f;
  int mode = kNovogradDecoupled;
  bool bias_correction = true;
  ScalarArg step;                    // one count, or one per tensor
  const float* grad_norms = nullptr;
  // Resolved per tensor by at_tensor.
  float grad_norm = 0.f, bias_correction1 = 1.f, bias_correction2 = 1.f;

  APEX_HD ListMask reads() const { return lists_mask({0, 1, 2}); }
  APEX_HD ListMask writes() const { return lists_mask({1, 2}); }
  APEX_HD NovogradFunctor at_tensor(int64_t tensor) const {
    NovogradFunctor r = *this;
    r.grad_norm = grad_norms[tensor];
    if (bias_correction) {
      const float s = step.get(tensor);
      r.bias_correction1 = 1.f - pow_scalar(beta1, s);
      r.bias_correction2 = ScalarMath<float>::sqrt(1.f - pow_scalar(beta2, s));
    }
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

void novograd_update(const Cpu&, const TensorLists& lists, int* flag, const NovogradFunctor& op);
void novograd_update(const Cuda&, const TensorLists& lists, int* flag, const NovogradFunctor& op);

// grad_norms[t] <- blend of its old value and this step's norm of grads[t] (weights beta2 and
// 1 - beta2; norm_type 2: L2, 0: L-inf), then the update with the blended norms.
template <class Device>
void novograd(const Device& device, const TensorLists& lists, int* flag, NovogradFunctor op, int norm_type,
              float* grad_norms, float* total, float* scratch) {
  NormArgs norms;
  norms.abs_max = norm_type == 0;
  norms.out.total = total;
  norms.out.per_tensor = grad_norms;
  norms.out.scratch = scratch;
  norms.out.mode = norm_type == 2 ? PerTensorOut::kBlendL2 : PerTensorOut::kBlendMax;
  norms.out.keep = op.beta2;
  norms.out.take = 1.f - op.beta2;
  std::vector<void*> storage;
  norm(device, lists.select({0}, storage), flag, norms);
  op.grad_norms = grad_norms;
  novograd_update(device, lists, flag, op);
}

template <class Engine, class Device>
void run_novograd_update(const Device& device, const TensorLists& lists, int* flag, const NovogradFunctor& op) {
  dispatch_floating<false>(lists.dtypes[1], [&](auto p) {
    using T = TypeOf<decltype(p)>;
    Engine::template elementwise<TypeList<T, T, T>>(device, lists, flag, op);
  });
}

}  // namespace apex::multi_tensor
