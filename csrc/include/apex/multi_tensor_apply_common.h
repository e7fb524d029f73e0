// Pieces of the multi-tensor apply engine shared by its CPU and CUDA back ends:
// host-side validation of the tensor lists, the per-list element types of a launch,
// dtype dispatch, and the base every multi-tensor functor derives from.
//
// A functor ("op") sees one element of every list at a time, as values of a math
// type V (float or double on CUDA, at::vec::Vectorized<float|double> on CPU), so the
// same source line computes the same formula on both devices.
#pragma once

#include <ATen/ATen.h>
#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <optional>
#include <type_traits>
#include <vector>

#include "apex/check.h"
#include "apex/multi_tensor_math.h"

#define APEX_HD C10_HOST_DEVICE

namespace apex::multi_tensor {

// Element types of the tensor lists of one launch, in list order.
template <class... Ts>
struct TypeList {
  static constexpr int kDepth = sizeof...(Ts);
  template <int I>
  using At = std::tuple_element_t<I, std::tuple<Ts...>>;
  static constexpr bool kHasDouble = (std::is_same_v<Ts, double> || ...);
  static constexpr int kWidestBytes = static_cast<int>(std::max({sizeof(Ts)...}));
  // Double lists are computed in double; everything else in float.
  using Math = std::conditional_t<kHasDouble, double, float>;
};

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for the C++ type of `dtype` among fp32/fp16/bf16 (and fp64 when kWithDouble).
template <bool kWithDouble = false, class F>
decltype(auto) dispatch_floating(at::ScalarType dtype, const char* op, const char* what, F&& f) {
  switch (dtype) {
    case at::kFloat:
      return f(TypeTag<float>{});
    case at::kHalf:
      return f(TypeTag<at::Half>{});
    case at::kBFloat16:
      return f(TypeTag<at::BFloat16>{});
    case at::kDouble:
      if constexpr (kWithDouble) return f(TypeTag<double>{});
      [[fallthrough]];
    default:
      APEX_CHECK(false, op, ": unsupported dtype ", dtype, " for ", what, " (expected float32, float16 or bfloat16",
                 kWithDouble ? " or float64)" : ")");
  }
}

// Optimizer lists: calls f(TypeTag<P>{}, TypeTag<S>{}) for the params/grads dtype P and the
// optimizer-state dtype S, which is either float32 (fp32 states of fp16/bf16 params) or P.
template <bool kWithDouble = false, class F>
void dispatch_param_state(const char* op, at::ScalarType params, at::ScalarType states, F&& f) {
  dispatch_floating<kWithDouble>(params, op, "params", [&](auto p) {
    using P = typename decltype(p)::type;
    if (states == params) {
      f(p, p);
    } else if constexpr (!std::is_same_v<P, float> && !std::is_same_v<P, double>) {
      APEX_CHECK(states == at::kFloat, op, ": optimizer states must be float32 or the params' dtype (", params,
                 "), got ", states);
      f(p, TypeTag<float>{});
    } else {
      APEX_CHECK(false, op, ": optimizer states must have the params' dtype (", params, "), got ", states);
    }
  });
}

// Bit i set = list i. Functors describe which lists they read, write and check for inf/nan.
using ListMask = uint32_t;
constexpr ListMask lists_mask(std::initializer_list<int> lists) {
  ListMask mask = 0;
  for (int l : lists) mask |= ListMask{1} << l;
  return mask;
}

// What a functor's call returns and how the engine combines it: nothing (elementwise), or a
// term per element summed (squares -> L2 norm) or maxed (|x| -> L-inf norm) per chunk.
enum class Reduce { kNone, kSum, kMax };

// Defaults for a functor; a functor overrides what it needs (name hiding, no virtuals).
//   reads()/writes()/checks(): which lists are loaded, stored, and tested for non-finite
//       inputs (a non-finite checked input sets the noop/overflow flag, as apex does).
//   at_tensor(t): a copy specialised for tensor t of the call (per-tensor norms, or
//       scalars read from device tensors such as lr/step/inv_scale), evaluated once a chunk.
//   skip(): true once at_tensor has found the step must not run (apex's "noop" exits).
//   kSkipIfFlagSet: the kernel does nothing when the noop flag is already set on entry.
template <class Derived>
struct FunctorBase {
  static constexpr Reduce kReduce = Reduce::kNone;
  static constexpr bool kSkipIfFlagSet = false;
  APEX_HD ListMask checks() const { return 0; }
  APEX_HD Derived at_tensor(int /*tensor*/) const { return static_cast<const Derived&>(*this); }
  APEX_HD bool skip() const { return false; }
};

// How a reduction's per-tensor results are written (see multi_tensor_l2norm and novograd).
enum class PerTensorOut : int {
  kNone = 0,     // only the total
  kWrite = 1,    // out[t] = norm_t
  kBlendL2 = 2,  // out[t] = sqrt(keep * out[t]^2 + take * norm_t^2)   (novograd, L2)
  kBlendMax = 3, // out[t] = keep * out[t] + take * norm_t             (novograd, L-inf)
};

struct NormOutputs {
  at::Tensor total;       // float32 [1]
  at::Tensor per_tensor;  // float32 [ntensors], or [0] when not requested
};

// Optional, caller-provided details of a norm reduction.
struct NormRequest {
  PerTensorOut per_tensor = PerTensorOut::kNone;
  at::Tensor blend_into;      // for kBlend*: the float32 [ntensors] tensor updated in place
  float keep = 0.f, take = 0.f;
  bool zero_if_flag_set = false;  // l2norm_mp: a set flag means "skip": results are 0
};

template <Reduce R>
APEX_HD inline float combine_partials(float a, float b) {
  if constexpr (R == Reduce::kMax) return ScalarMath<float>::max(a, b);
  return a + b;
}

template <Reduce R>
APEX_HD inline float finish_norm(float combined) {
  if constexpr (R == Reduce::kMax) return combined;
  return ScalarMath<float>::sqrt(combined);
}

// The per-tensor output for tensor t: `combined` is its sum of squares (kSum) or max |x| (kMax).
template <Reduce R>
APEX_HD inline float per_tensor_result(PerTensorOut mode, float old, float combined, float keep, float take) {
  switch (mode) {
    case PerTensorOut::kBlendL2:
      return ScalarMath<float>::sqrt(keep * old * old + take * combined);
    case PerTensorOut::kBlendMax:
      return keep * old + take * combined;
    default:
      return finish_norm<R>(combined);
  }
}

// Outputs of a norm reduction over `num_tensors` tensors, on the flag's device.
inline NormOutputs allocate_norm_outputs(const char* op, int64_t num_tensors, const at::Tensor& noop_flag,
                                         const NormRequest& request) {
  const auto options = noop_flag.options().dtype(at::kFloat);
  NormOutputs out;
  out.total = at::empty({1}, options);
  if (request.per_tensor == PerTensorOut::kWrite) {
    out.per_tensor = at::empty({num_tensors}, options);
  } else if (request.per_tensor == PerTensorOut::kNone) {
    out.per_tensor = at::empty({0}, options);
  } else {
    const at::Tensor& into = request.blend_into;
    APEX_CHECK(into.defined() && into.scalar_type() == at::kFloat && into.numel() == num_tensors &&
                   into.is_contiguous() && into.device() == noop_flag.device(),
               op, ": the per-tensor norm buffer must be a contiguous float32 tensor of ", num_tensors,
               " elements on ", noop_flag.device());
    out.per_tensor = into;
  }
  return out;
}

inline int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// Validates the lists of one call before anything is launched. All lists have the same
// length (> 0); tensor t of every list has the same numel, the same dense layout and lies on
// the same device as the int32 flag. Per-list dtypes are checked by each op's dispatch.
inline void check_tensor_lists(const char* op, int64_t chunk_size, const at::Tensor& noop_flag,
                               const std::vector<at::TensorList>& lists) {
  APEX_CHECK(chunk_size > 0, op, ": chunk_size must be positive, got ", chunk_size);
  APEX_CHECK(noop_flag.scalar_type() == at::kInt, op, ": the noop/overflow flag must be an int32 tensor, got ",
             noop_flag.scalar_type());
  APEX_CHECK(noop_flag.numel() >= 1, op, ": the noop/overflow flag must have at least one element");
  APEX_CHECK(!lists.empty() && !lists[0].empty(), op, ": the tensor lists are empty");
  const size_t count = lists[0].size();
  const at::Device device = noop_flag.device();
  for (size_t l = 0; l < lists.size(); ++l) {
    APEX_CHECK(lists[l].size() == count, op, ": tensor list ", l, " has ", lists[l].size(),
               " tensors but list 0 has ", count);
    for (size_t t = 0; t < count; ++t) {
      const at::Tensor& x = lists[l][t];
      APEX_CHECK(x.defined(), op, ": tensor ", t, " of list ", l, " is undefined");
      APEX_CHECK(x.device() == device, op, ": tensor ", t, " of list ", l, " is on ", x.device(),
                 " but the flag is on ", device, " (all tensors and the flag must share one device)");
      APEX_CHECK(x.is_non_overlapping_and_dense(), op, ": tensor ", t, " of list ", l,
                 " is not dense (make it contiguous)");
      const at::Tensor& first = lists[0][t];
      APEX_CHECK(x.numel() == first.numel(), op, ": tensor ", t, " of list ", l, " has ", x.numel(),
                 " elements but list 0 has ", first.numel());
      APEX_CHECK(x.numel() <= 1 || x.strides() == first.strides(), op, ": tensor ", t, " of list ", l,
                 " has a different memory layout than tensor ", t, " of list 0");
    }
  }
}

// The one dtype shared by every tensor of `list` (`what` names the list in errors).
inline at::ScalarType list_dtype(const char* op, at::TensorList list, const char* what) {
  APEX_CHECK(!list.empty(), op, ": the tensor lists are empty (", what, " has no tensors)");
  const at::ScalarType dtype = list[0].scalar_type();
  for (size_t t = 1; t < list.size(); ++t) {
    APEX_CHECK(list[t].scalar_type() == dtype, op, ": every tensor of ", what, " must share one dtype (tensor 0 is ",
               dtype, ", tensor ", t, " is ", list[t].scalar_type(), ")");
  }
  return dtype;
}

// A 1-element scalar tensor that kernels read on their own device (capturable optimizers).
inline void check_scalar_tensor(const char* op, const at::Tensor& x, const at::Tensor& flag, const char* what,
                                std::initializer_list<at::ScalarType> dtypes) {
  APEX_CHECK(x.defined() && x.numel() == 1, op, ": ", what, " must be a one-element tensor");
  APEX_CHECK(x.device() == flag.device(), op, ": ", what, " is on ", x.device(), " but the tensors are on ",
             flag.device());
  bool ok = false;
  for (auto d : dtypes) ok = ok || x.scalar_type() == d;
  APEX_CHECK(ok, op, ": ", what, " has unsupported dtype ", x.scalar_type());
}

}  // namespace apex::multi_tensor
