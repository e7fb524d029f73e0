// multi_tensor_scale (out = in * scale) and multi_tensor_axpby (out = a * x + b * y): amp's copy
// and unscale kernels. Both flag inf/nan inputs through the noop flag.
#pragma once

#include "apex/multi_tensor_kernel.h"

namespace apex::multi_tensor {

// lists: [in, out]
struct ScaleFunctor : FunctorBase<ScaleFunctor> {
  float scale = 1.f;
  APEX_HD ListMask reads() const { return lists_mask({0}); }
  APEX_HD ListMask writes() const { return lists_mask({1}); }
  APEX_HD ListMask checks() const { return lists_mask({0}); }
  template <class V>
  APEX_HD void operator()(V& in, V& out) const {
    out = in * V(scale);
  }
};

// lists: [x, y, out]; arg_to_check: -1 checks x and y, 0 only x, 1 only y.
struct AxpbyFunctor : FunctorBase<AxpbyFunctor> {
  float a = 1.f, b = 1.f;
  int arg_to_check = -1;
  APEX_HD ListMask reads() const { return lists_mask({0, 1}); }
  APEX_HD ListMask writes() const { return lists_mask({2}); }
  APEX_HD ListMask checks() const {
    return arg_to_check == -1 ? lists_mask({0, 1}) : arg_to_check == 0 ? lists_mask({0}) : lists_mask({1});
  }
  template <class V>
  APEX_HD void operator()(V& x, V& y, V& out) const {
    out = V(a) * x + V(b) * y;
  }
};

void scale(const Cpu&, const TensorLists& lists, int* flag, const ScaleFunctor& op);
void scale(const Cuda&, const TensorLists& lists, int* flag, const ScaleFunctor& op);
// lists: [x, y, out], each list of any float dtype of its own (as NVIDIA and ROCm apex allow).
void axpby(const Cpu&, const TensorLists& lists, int* flag, const AxpbyFunctor& op);
void axpby(const Cuda&, const TensorLists& lists, int* flag, const AxpbyFunctor& op);  // axpby_cuda.cu

template <class Engine, class Device>
void run_scale(const Device& device, const TensorLists& lists, int* flag, const ScaleFunctor& op) {
  dispatch_floating<false>(lists.dtypes[0], [&](auto in) {
    using In = TypeOf<decltype(in)>;
    dispatch_floating<false>(lists.dtypes[1], [&](auto out) {
      Engine::template elementwise<TypeList<In, TypeOf<decltype(out)>>>(device, lists, flag, op);
    });
  });
}

template <class Engine, class Device>
void run_axpby(const Device& device, const TensorLists& lists, int* flag, const AxpbyFunctor& op) {
  dispatch_floating<false>(lists.dtypes[0], [&](auto x) {
    using X = TypeOf<decltype(x)>;
    dispatch_floating<false>(lists.dtypes[1], [&](auto y) {
      using Y = TypeOf<decltype(y)>;
      dispatch_floating<false>(lists.dtypes[2], [&](auto out) {
        Engine::template elementwise<TypeList<X, Y, TypeOf<decltype(out)>>>(device, lists, flag, op);
      });
    });
  });
}

}  // namespace apex::multi_tensor
