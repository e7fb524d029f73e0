// multi_tensor_scale (out = in * scale) and multi_tensor_axpby (out = a * x + b * y):
// the copy/unscale kernels of amp. Both flag inf/nan inputs through the noop flag.
#pragma once

#include <torch/library.h>

#include "apex/multi_tensor_apply_common.h"

namespace apex::multi_tensor {

// lists: [in, out]
struct ScaleFunctor : FunctorBase<ScaleFunctor> {
  float scale;
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
  float a, b;
  int arg_to_check;
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

template <class Engine>
void multi_tensor_scale(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList inputs,
                        at::TensorList outputs, double scale) {
  constexpr const char* kName = "multi_tensor_scale";
  dispatch_floating(list_dtype(kName, inputs, "inputs"), kName, "inputs", [&](auto in) {
    dispatch_floating(list_dtype(kName, outputs, "outputs"), kName, "outputs", [&](auto out) {
      using Types = TypeList<typename decltype(in)::type, typename decltype(out)::type>;
      ScaleFunctor op;
      op.scale = static_cast<float>(scale);
      Engine::template elementwise<Types>(kName, chunk_size, noop_flag, {inputs, outputs}, op);
    });
  });
}

template <class Engine>
void multi_tensor_axpby(int64_t chunk_size, const at::Tensor& noop_flag, at::TensorList x, at::TensorList y,
                        at::TensorList out, double a, double b, int64_t arg_to_check) {
  constexpr const char* kName = "multi_tensor_axpby";
  APEX_CHECK(arg_to_check >= -1 && arg_to_check <= 1, kName, ": arg_to_check must be -1, 0 or 1, got ",
             arg_to_check);
  dispatch_floating(list_dtype(kName, x, "x"), kName, "x", [&](auto tx) {
    dispatch_floating(list_dtype(kName, y, "y"), kName, "y", [&](auto ty) {
      dispatch_floating(list_dtype(kName, out, "out"), kName, "out", [&](auto tout) {
        using Types =
            TypeList<typename decltype(tx)::type, typename decltype(ty)::type, typename decltype(tout)::type>;
        AxpbyFunctor op;
        op.a = static_cast<float>(a);
        op.b = static_cast<float>(b);
        op.arg_to_check = static_cast<int>(arg_to_check);
        Engine::template elementwise<Types>(kName, chunk_size, noop_flag, {x, y, out}, op);
      });
    });
  });
}

// Registers this file's ops for the dispatch key of `m` (CPU or CUDA), run by `Engine`.
template <class Engine>
void register_scale_kernels(torch::Library& m) {
  m.impl("multi_tensor_scale", &multi_tensor_scale<Engine>);
  m.impl("multi_tensor_axpby", &multi_tensor_axpby<Engine>);
}

}  // namespace apex::multi_tensor
