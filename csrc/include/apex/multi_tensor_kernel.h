// What a multi-tensor kernel receives, on any device: the tensors of one call as plain pointers
// (TensorLists), the functor contract every multi-tensor kernel is written in (FunctorBase), and
// the dtype dispatch of a call's lists. No torch headers: CUDA kernel sources include this; the op
// functions build a TensorLists from tensors with multi_tensor_op.h.
//
// A functor ("op") sees one element of every list at a time, as values of a math type V (float or
// double in CUDA kernels, at::vec::Vectorized<float|double> on CPU), so the same source line
// computes the same formula on both devices:
//
//   struct ScaleFunctor : FunctorBase<ScaleFunctor> {     // lists: [in, out]
//     float scale;
//     APEX_HD ListMask reads() const { return lists_mask({0}); }
//     APEX_HD ListMask writes() const { return lists_mask({1}); }
//     template <class V> APEX_HD void operator()(V& in, V& out) const { out = in * V(scale); }
//   };
#pragma once

#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <type_traits>
#include <vector>

#include "apex/device.h"
#include "apex/dtype.h"
#include "apex/multi_tensor_math.h"

#define APEX_HD C10_HOST_DEVICE

namespace apex::multi_tensor {

// The deepest call: grads, params, three optimizer states and a copy (RMSprop with momentum and
// centering; Adam with master weights).
constexpr int kMaxLists = 5;

// The tensors of one call: `depth` lists of `count` tensors each; tensor t of every list has
// numel[t] elements, dense and laid out alike, so element i of one is element i of the others.
// A list the call leaves out (an optional one) has null pointers; functors never touch it.
struct TensorLists {
  const char* op = "multi_tensor";      // the op's name, for errors
  int depth = 0;
  int64_t count = 0;
  int64_t chunk_size = 0;               // elements per CPU task (CUDA kernels tile on their own)
  Dtype dtypes[kMaxLists] = {};
  void* const* data = nullptr;          // data[list * count + tensor]
  const int64_t* numel = nullptr;       // numel[tensor]
  const int64_t* rows = nullptr;        // rows[tensor]: size(0) of 2-d+ tensors, 1 otherwise (AdamP)

  void* at(int list, int64_t tensor) const { return data[list * count + tensor]; }
  // Whether the call has list `list` (optional lists left out have null pointers).
  bool has(int list) const { return list < depth && count > 0 && at(list, 0) != nullptr; }

  // Lists `which` of this call (in that order) as a call of their own; `storage` holds the pointers.
  TensorLists select(std::initializer_list<int> which, std::vector<void*>& storage) const {
    TensorLists out = *this;
    out.depth = static_cast<int>(which.size());
    storage.assign(static_cast<size_t>(out.depth * count), nullptr);
    int d = 0;
    for (int list : which) {
      out.dtypes[d] = dtypes[list];
      std::copy(data + list * count, data + (list + 1) * count, storage.begin() + d * count);
      ++d;
    }
    out.data = storage.data();
    return out;
  }
};

// Element types of the lists of one launch, in list order (CUDA kernels are typed by them; the
// CPU engine converts blocks at run time and only uses kDepth and Math).
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

// The C++ type of a dispatch tag (apex::Type<T>), also when the tag is a lambda capture.
template <class Tag>
using TypeOf = typename std::decay_t<Tag>::type;

template <class T>
constexpr bool kIsReduced = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

// Optimizer lists: calls f(Type<P>{}, Type<S>{}) for the params' type P and the states' type S,
// which is P or (for 16-bit params) float32. The op function has refused other combinations.
template <bool kWithDouble = false, class F>
void dispatch_param_state(Dtype params, Dtype states, F&& f) {
  dispatch_floating<kWithDouble>(params, [&](auto p) {
    using P = typename decltype(p)::type;
    if constexpr (kIsReduced<P>) {
      if (states == params) {
        f(p, p);
      } else {
        f(p, Type<float>{});
      }
    } else {
      f(p, p);
    }
  });
}

// Bit i set = list i. Functors say which lists they read, write and check for inf/nan.
using ListMask = uint32_t;
constexpr ListMask lists_mask(std::initializer_list<int> lists) {
  ListMask mask = 0;
  for (int l : lists) mask |= ListMask{1} << l;
  return mask;
}

// What a functor's call returns and how the engine combines it: nothing (elementwise), or a
// term per element summed (squares -> L2 norm) or maxed (|x| -> L-inf norm).
enum class Reduce { kNone, kSum, kMax };

// Defaults for a functor; a functor overrides what it needs (name hiding, no virtuals).
//   reads()/writes()/checks(): the lists loaded, stored, and tested for non-finite inputs (a
//       non-finite checked input sets the noop/overflow flag, as apex does).
//   at_tensor(t): a copy specialised for tensor t of the call (per-tensor norms or steps, scalars
//       read from device memory), evaluated once per run of a tensor's elements.
//   at_row(r): row-wise kernels only, a copy of the at_tensor copy specialised for global row r.
//   skip(): true once at_tensor has found that tensor must not be updated.
//   skip_if_flag_set(): the kernel does nothing when the flag is already set on entry.
template <class Derived>
struct FunctorBase {
  static constexpr Reduce kReduce = Reduce::kNone;
  APEX_HD ListMask checks() const { return 0; }
  APEX_HD Derived at_tensor(int64_t /*tensor*/) const { return static_cast<const Derived&>(*this); }
  APEX_HD Derived at_row(int64_t /*row*/) const { return static_cast<const Derived&>(*this); }
  APEX_HD bool skip() const { return false; }
  APEX_HD bool skip_if_flag_set() const { return false; }
};

// How a reduction's per-tensor results are written (multi_tensor_l2norm and NovoGrad).
enum class PerTensorOut : int {
  kNone = 0,      // only the total
  kWrite = 1,     // out[t] = norm_t
  kBlendL2 = 2,   // out[t] = sqrt(keep * out[t]^2 + take * norm_t^2)   (NovoGrad, L2)
  kBlendMax = 3,  // out[t] = keep * out[t] + take * norm_t             (NovoGrad, L-inf)
};

// Where a reduction writes: float32 memory on the kernel's device, allocated by the op function.
struct NormOut {
  float* total = nullptr;        // [1]
  float* per_tensor = nullptr;   // [count], or null for kNone
  float* scratch = nullptr;      // reduction_scratch() floats (CUDA), unused on CPU
  PerTensorOut mode = PerTensorOut::kNone;
  float keep = 0.f, take = 0.f;
  bool zero_if_flag_set = false;  // l2norm_mp: a set flag means "skip": every result is 0
};

// Floats of scratch a reduction over `count` tensors needs (per-block partials on CUDA).
int64_t reduction_scratch(const Cuda&, int64_t count);
inline int64_t reduction_scratch(const Cpu&, int64_t /*count*/) { return 0; }

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

// ---- row-wise kernels (multi_tensor_rows.cuh; AdamP's channels, LAMB's per-tensor sums) ---------

// Elements of a row one warp takes at a time (a "piece"): 32 lanes x 16 elements.
constexpr int64_t kPieceElems = 512;
// What a row-wise reduction functor returns per element: N terms, summed per piece.
template <class V, int N>
struct Sums {
  V v[N];
};

// Where tensor t's rows and pieces are, for `lists.rows` (0: a 0/1-d tensor, one row, never
// projected; no `rows` at all: every tensor is one row).
struct RowLayout {
  std::vector<int64_t> first_row, first_piece;
  int64_t rows = 0, pieces = 0;

  static int64_t row_count(const TensorLists& lists, int64_t t) {
    if (lists.rows != nullptr && lists.rows[t] > 0) return lists.rows[t];
    return lists.numel[t] > 0 ? 1 : 0;
  }
  static int64_t row_length(const TensorLists& lists, int64_t t) {
    const int64_t rows = row_count(lists, t);
    return rows > 0 ? lists.numel[t] / rows : 0;
  }
  static int64_t pieces_per_row(const TensorLists& lists, int64_t t) {
    return (row_length(lists, t) + kPieceElems - 1) / kPieceElems;
  }
  explicit RowLayout(const TensorLists& lists) {
    first_row.resize(static_cast<size_t>(lists.count));
    first_piece.resize(static_cast<size_t>(lists.count));
    for (int64_t t = 0; t < lists.count; ++t) {
      first_row[t] = rows;
      first_piece[t] = pieces;
      rows += row_count(lists, t);
      pieces += row_count(lists, t) * pieces_per_row(lists, t);
    }
  }
};

// Per-tensor sums over whole tensors (Engine::tensor_sums): floats of scratch the CUDA engine needs
// for `sums` sums per tensor, one set per piece of every tensor.
inline int64_t tensor_sums_scratch(const TensorLists& lists, int sums) {
  int64_t pieces = 0;
  for (int64_t t = 0; t < lists.count; ++t) pieces += (lists.numel[t] + kPieceElems - 1) / kPieceElems;
  return pieces * sums;
}

}  // namespace apex::multi_tensor
