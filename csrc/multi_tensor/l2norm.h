// The norm family: multi_tensor_l2norm (total and per-tensor L2 norms), l2norm_mp (a no-op once
// the flag is set), l2norm_scale (norm of the input while writing input * scale),
// unscale_l2norm (norm of grads * inv_scale, grads unchanged), and the L-inf norm NovoGrad
// blends. LARS and the optimizers (global grad norms) reduce through these ops too. A non-finite
// norm sets the flag, as in apex.
#pragma once

#include "apex/multi_tensor_kernel.h"

namespace apex::multi_tensor {

// lists [x]: terms (x * scale)^2. lists [in, out]: out = in * scale, terms in^2.
struct SquareFunctor : FunctorBase<SquareFunctor> {
  static constexpr Reduce kReduce = Reduce::kSum;
  ScalarArg scale{1.f};
  bool write_out = false;
  bool skip_flag = false;
  APEX_HD ListMask reads() const { return lists_mask({0}); }
  APEX_HD ListMask writes() const { return write_out ? lists_mask({1}) : 0; }
  APEX_HD bool skip_if_flag_set() const { return skip_flag; }
  APEX_HD SquareFunctor at_tensor(int64_t /*tensor*/) const {
    SquareFunctor resolved = *this;
    resolved.scale = ScalarArg{scale.get()};
    return resolved;
  }
  template <class V>
  APEX_HD V operator()(V& x) const {
    const V scaled = x * V(scale.value);
    return scaled * scaled;
  }
  template <class V>
  APEX_HD V operator()(V& in, V& out) const {
    out = in * V(scale.value);
    return in * in;
  }
};

// lists [x]: terms |x| (the L-inf norm).
struct AbsMaxFunctor : FunctorBase<AbsMaxFunctor> {
  static constexpr Reduce kReduce = Reduce::kMax;
  APEX_HD ListMask reads() const { return lists_mask({0}); }
  APEX_HD ListMask writes() const { return 0; }
  template <class V>
  APEX_HD V operator()(V& x) const {
    return VecMath<V>::abs(x);
  }
};

struct NormArgs {
  SquareFunctor square;       // the L2 terms (scale, write_out, skip on a set flag)
  bool abs_max = false;       // the L-inf norm instead
  NormOut out;
};

// The norms of lists [x] (or [in, out], see SquareFunctor): out.total and per-tensor results.
void norm(const Cpu&, const TensorLists& lists, int* flag, const NormArgs& args);
void norm(const Cuda&, const TensorLists& lists, int* flag, const NormArgs& args);

template <class Engine, class Device>
void run_norm(const Device& device, const TensorLists& lists, int* flag, const NormArgs& args) {
  dispatch_floating<false>(lists.dtypes[0], [&](auto in) {
    using In = TypeOf<decltype(in)>;
    if (args.abs_max) {
      Engine::template reduce<TypeList<In>>(device, lists, flag, AbsMaxFunctor{}, args.out);
    } else if (lists.depth == 1) {
      Engine::template reduce<TypeList<In>>(device, lists, flag, args.square, args.out);
    } else {
      dispatch_floating<false>(lists.dtypes[1], [&](auto out) {
        using Types = TypeList<In, TypeOf<decltype(out)>>;
        Engine::template reduce<Types>(device, lists, flag, args.square, args.out);
      });
    }
  });
}

}  // namespace apex::multi_tensor
