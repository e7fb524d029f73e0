// The L2-norm family: multi_tensor_l2norm (total and per-tensor norms), its mixed-precision
// variant l2norm_mp (a no-op once the flag is set), l2norm_scale (norm of the input while
// writing input * scale) and unscale_l2norm (norm of grads * inv_scale, grads unchanged).
// Each returns (total_norm float32[1], per_tensor_norms float32[ntensors] or [0]); a
// non-finite norm sets the flag, as in apex.
#pragma once

#include <tuple>

#include <torch/library.h>

#include "apex/multi_tensor_apply_common.h"

namespace apex::multi_tensor {

// lists: [x]; sum of x^2. kSkip: l2norm_mp, which does nothing once the flag is set.
template <bool kSkip>
struct SquareFunctor : FunctorBase<SquareFunctor<kSkip>> {
  static constexpr Reduce kReduce = Reduce::kSum;
  static constexpr bool kSkipIfFlagSet = kSkip;
  APEX_HD ListMask reads() const { return lists_mask({0}); }
  APEX_HD ListMask writes() const { return 0; }
  template <class V>
  APEX_HD V operator()(V& x) const {
    return x * x;
  }
};

// lists: [x]; max |x| (the L-inf norm of novograd).
struct AbsMaxFunctor : FunctorBase<AbsMaxFunctor> {
  static constexpr Reduce kReduce = Reduce::kMax;
  APEX_HD ListMask reads() const { return lists_mask({0}); }
  APEX_HD ListMask writes() const { return 0; }
  template <class V>
  APEX_HD V operator()(V& x) const {
    return VecMath<V>::abs(x);
  }
};

// lists: [in, out]; out = in * scale, norm of in.
struct ScaleSquareFunctor : FunctorBase<ScaleSquareFunctor> {
  static constexpr Reduce kReduce = Reduce::kSum;
  float scale;
  APEX_HD ListMask reads() const { return lists_mask({0}); }
  APEX_HD ListMask writes() const { return lists_mask({1}); }
  template <class V>
  APEX_HD V operator()(V& in, V& out) const {
    out = in * V(scale);
    return in * in;
  }
};

// lists: [grads]; norm of grads * inv_scale (inv_scale read from a device tensor).
struct UnscaleSquareFunctor : FunctorBase<UnscaleSquareFunctor> {
  static constexpr Reduce kReduce = Reduce::kSum;
  ScalarArg inv_scale;
  APEX_HD ListMask reads() const { return lists_mask({0}); }
  APEX_HD ListMask writes() const { return 0; }
  APEX_HD UnscaleSquareFunctor at_tensor(int) const {
    UnscaleSquareFunctor resolved = *this;
    resolved.inv_scale = ScalarArg{inv_scale.get(), nullptr};
    return resolved;
  }
  template <class V>
  APEX_HD V operator()(V& g) const {
    const V unscaled = g * V(inv_scale.value);
    return unscaled * unscaled;
  }
};

inline NormRequest norm_request(std::optional<bool> per_tensor) {
  NormRequest request;
  request.per_tensor = per_tensor.value_or(false) ? PerTensorOut::kWrite : PerTensorOut::kNone;
  return request;
}

// Norm over the tensors of `tensors` (one dtype) with functor `op`, plus any extra lists.
template <class Engine, class Op>
std::tuple<at::Tensor, at::Tensor> reduce_norm(const char* name, int64_t chunk_size, const at::Tensor& noop_flag,
                                               at::TensorList tensors, const Op& op, const NormRequest& request) {
  NormOutputs out;
  dispatch_floating(list_dtype(name, tensors, "tensors"), name, "tensors", [&](auto tag) {
    using T = typename decltype(tag)::type;
    out = Engine::template reduce<TypeList<T>>(name, chunk_size, noop_flag, {tensors}, op, request);
  });
  return {out.total, out.per_tensor};
}

template <class Engine>
std::tuple<at::Tensor, at::Tensor> multi_tensor_l2norm(int64_t chunk_size, const at::Tensor& noop_flag,
                                                       at::TensorList tensors, std::optional<bool> per_tensor) {
  return reduce_norm<Engine>("multi_tensor_l2norm", chunk_size, noop_flag, tensors, SquareFunctor<false>{},
                             norm_request(per_tensor));
}

template <class Engine>
std::tuple<at::Tensor, at::Tensor> multi_tensor_l2norm_mp(int64_t chunk_size, const at::Tensor& noop_flag,
                                                          at::TensorList tensors, std::optional<bool> per_tensor) {
  NormRequest request = norm_request(per_tensor);
  request.zero_if_flag_set = true;
  return reduce_norm<Engine>("multi_tensor_l2norm_mp", chunk_size, noop_flag, tensors, SquareFunctor<true>{},
                             request);
}

template <class Engine>
std::tuple<at::Tensor, at::Tensor> multi_tensor_unscale_l2norm(int64_t chunk_size, const at::Tensor& noop_flag,
                                                               at::TensorList tensors, const at::Tensor& inv_scale,
                                                               std::optional<bool> per_tensor) {
  constexpr const char* kName = "multi_tensor_unscale_l2norm";
  check_scalar_tensor(kName, inv_scale, noop_flag, "inv_scale", {at::kFloat});
  UnscaleSquareFunctor op;
  op.inv_scale.ptr = inv_scale.data_ptr<float>();
  return reduce_norm<Engine>(kName, chunk_size, noop_flag, tensors, op, norm_request(per_tensor));
}

template <class Engine>
std::tuple<at::Tensor, at::Tensor> multi_tensor_l2norm_scale(int64_t chunk_size, const at::Tensor& noop_flag,
                                                             at::TensorList inputs, at::TensorList outputs,
                                                             double scale, std::optional<bool> per_tensor) {
  constexpr const char* kName = "multi_tensor_l2norm_scale";
  NormOutputs out;
  ScaleSquareFunctor op;
  op.scale = static_cast<float>(scale);
  dispatch_floating(list_dtype(kName, inputs, "inputs"), kName, "inputs", [&](auto in) {
    dispatch_floating(list_dtype(kName, outputs, "outputs"), kName, "outputs", [&](auto o) {
      using Types = TypeList<typename decltype(in)::type, typename decltype(o)::type>;
      out = Engine::template reduce<Types>(kName, chunk_size, noop_flag, {inputs, outputs}, op,
                                           norm_request(per_tensor));
    });
  });
  return {out.total, out.per_tensor};
}

// Registers this file's ops for the dispatch key of `m` (CPU or CUDA), run by `Engine`.
template <class Engine>
void register_l2norm_kernels(torch::Library& m) {
  m.impl("multi_tensor_l2norm", &multi_tensor_l2norm<Engine>);
  m.impl("multi_tensor_l2norm_mp", &multi_tensor_l2norm_mp<Engine>);
  m.impl("multi_tensor_l2norm_scale", &multi_tensor_l2norm_scale<Engine>);
  m.impl("multi_tensor_unscale_l2norm", &multi_tensor_unscale_l2norm<Engine>);
}

}  // namespace apex::multi_tensor
