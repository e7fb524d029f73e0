// CPU back end of the multi-tensor apply engine.
//
// Every tensor is cut into chunks of `chunk_size` elements; at::parallel_for spreads the chunks
// of all tensors over torch's threads. Inside a chunk, blocks of kBlock elements of each list are
// converted to the math type (float, or double for double lists) with ATen's vectorized
// converters, the functor runs on at::vec::Vectorized values, and written lists are converted
// back. The element types are read from the call at run time (a switch per block and list), so
// one compiled loop per functor serves every dtype combination. Reductions keep one partial per
// chunk, so results do not depend on the number of threads.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <atomic>
#include <utility>
#include <vector>

#include "apex/multi_tensor_kernel.h"

namespace apex::multi_tensor {

template <class M>
struct VecMath<at::vec::Vectorized<M>> {
  using Vec = at::vec::Vectorized<M>;
  static Vec sqrt(const Vec& x) { return x.sqrt(); }
  static Vec abs(const Vec& x) { return x.abs(); }
  static Vec max(const Vec& a, const Vec& b) { return at::vec::maximum(a, b); }
  static Vec min(const Vec& a, const Vec& b) { return at::vec::minimum(a, b); }
  static Vec fma(const Vec& a, const Vec& b, const Vec& c) { return at::vec::fmadd(a, b, c); }
  static Vec round_to(const Vec& x, Dtype dtype) {
    if constexpr (std::is_same_v<M, float>) {
      if (dtype == Dtype::kFloat16) {
        return std::get<0>(at::vec::convert_to_float<c10::Half>(at::vec::convert_from_float<c10::Half>(x, x)));
      }
      if (dtype == Dtype::kBFloat16) {
        return std::get<0>(at::vec::convert_to_float<c10::BFloat16>(at::vec::convert_from_float<c10::BFloat16>(x, x)));
      }
    }
    return x;
  }
};

namespace cpu_detail {

// Elements converted per step: a multiple of every Vectorized width, small enough for L1.
constexpr int64_t kBlock = 256;

template <class F, int... I>
inline void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}

template <int D, class F>
inline void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, D>{});
}

template <class Op, class V, int D, size_t... I>
inline auto call_op(const Op& op, V (&x)[D], std::index_sequence<I...>) {
  return op(x[I]...);
}

// n elements of a `dtype` list from element `offset` into M, and back.
template <class M>
inline void load(Dtype dtype, const void* base, int64_t offset, M* dst, int64_t n) {
  dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    at::vec::convert(static_cast<const T*>(base) + offset, dst, n);
  });
}

template <class M>
inline void store(Dtype dtype, const M* src, void* base, int64_t offset, int64_t n) {
  dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    at::vec::convert(src, static_cast<T*>(base) + offset, n);
  });
}

struct Chunk {
  int64_t tensor;
  int64_t begin, end;
};

inline std::vector<Chunk> split_into_chunks(const TensorLists& lists) {
  const int64_t chunk = (std::max<int64_t>(lists.chunk_size, 1) + kBlock - 1) / kBlock * kBlock;
  std::vector<Chunk> chunks;
  for (int64_t t = 0; t < lists.count; ++t) {
    for (int64_t begin = 0; begin < lists.numel[t]; begin += chunk) {
      chunks.push_back({t, begin, std::min(lists.numel[t], begin + chunk)});
    }
  }
  return chunks;
}

// Calls body(x) for the elements [begin, end) of tensor `tensor`, Vec::size() at a time: x[d] holds
// list d's values (read lists converted to M; lanes past the end and unread lists are 0), and the
// written lists' x[d] are stored back. Returns nothing; `body` keeps what it accumulates.
template <int D, class M, class Body>
void for_each_vector(const TensorLists& lists, int64_t tensor, int64_t begin, int64_t end, ListMask reads,
                     ListMask writes, Body&& body) {
  using Vec = at::vec::Vectorized<M>;
  void* base[D];
  for (int d = 0; d < D; ++d) base[d] = lists.at(d, tensor);
  alignas(64) M buf[D][kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    for (int d = 0; d < D; ++d) {
      if (reads & (ListMask{1} << d)) load(lists.dtypes[d], base[d], b, buf[d], n);
    }
    for (int64_t i = 0; i < n; i += Vec::size()) {
      const int count = static_cast<int>(std::min<int64_t>(Vec::size(), n - i));
      Vec x[D];
      // Unread lists are outputs the functor assigns; zero keeps them initialised.
      for (int d = 0; d < D; ++d) x[d] = (reads & (ListMask{1} << d)) ? Vec::loadu(buf[d] + i, count) : Vec(0);
      body(x, count);
      for (int d = 0; d < D; ++d) {
        if (writes & (ListMask{1} << d)) x[d].store(buf[d] + i, count);
      }
    }
    for (int d = 0; d < D; ++d) {
      if (writes & (ListMask{1} << d)) store(lists.dtypes[d], buf[d], base[d], b, n);
    }
  }
}

// The sum of a vector's lanes.
template <class M>
M lane_sum(const at::vec::Vectorized<M>& v) {
  alignas(64) M lanes[at::vec::Vectorized<M>::size()];
  v.store(lanes);
  M sum = 0;
  for (M lane : lanes) sum += lane;
  return sum;
}

// Runs `op` over [begin, end) of one tensor. Returns the chunk's reduction partial (0 for
// elementwise functors); clears `finite` if a checked input is inf/nan.
template <int D, class M, class Op>
M run_chunk(const TensorLists& lists, const Chunk& chunk, const Op& op, bool& finite) {
  using Vec = at::vec::Vectorized<M>;
  constexpr bool kReduces = Op::kReduce != Reduce::kNone;
  const ListMask checks = op.checks();
  Vec acc(0), probe(0);
  for_each_vector<D, M>(lists, chunk.tensor, chunk.begin, chunk.end, op.reads(), op.writes(),
                        [&](Vec (&x)[D], int /*count*/) {
                          // x - x is NaN exactly for inf/nan inputs; padded lanes are 0.
                          for (int d = 0; d < D; ++d) {
                            if (checks & (ListMask{1} << d)) probe = probe + (x[d] - x[d]);
                          }
                          if constexpr (kReduces) {
                            const Vec term = call_op(op, x, std::make_index_sequence<D>{});
                            acc = Op::kReduce == Reduce::kMax ? VecMath<Vec>::max(acc, term) : acc + term;
                          } else {
                            call_op(op, x, std::make_index_sequence<D>{});
                          }
                        });
  if (checks) finite = finite && !(lane_sum(probe) != M(0));
  if constexpr (kReduces) {
    if constexpr (Op::kReduce == Reduce::kMax) {
      alignas(64) M lanes[Vec::size()];
      acc.store(lanes);
      M partial = 0;
      for (M lane : lanes) partial = VecMath<M>::max(partial, lane);
      return partial;
    } else {
      return lane_sum(acc);
    }
  }
  return M(0);
}

// Elements a parallel task takes at least: torch's own elementwise kernels' grain
// (at::internal::GRAIN_SIZE, which lives in a heavy header), so that a small call (a few small
// tensors) runs on one thread instead of paying for a parallel region.
constexpr int64_t kTaskElements = 32768;

// Units (chunks, rows) a parallel task takes at least, for `units` sharing the call's elements.
inline int64_t units_per_task(const TensorLists& lists, int64_t units) {
  int64_t elements = 0;
  for (int64_t t = 0; t < lists.count; ++t) elements += lists.numel[t];
  const int64_t per_unit = std::max<int64_t>(1, elements / std::max<int64_t>(1, units));
  return std::max<int64_t>(1, kTaskElements / per_unit);
}

// Runs `op` over every chunk in parallel; returns the per-chunk partials of a reduction.
template <int D, class M, class Op>
std::vector<M> run_all(const TensorLists& lists, int* flag, const Op& op, const std::vector<Chunk>& chunks) {
  std::vector<M> partials(chunks.size(), 0);
  if (op.skip_if_flag_set() && *flag != 0) return partials;
  std::atomic<bool> saw_nonfinite{false};
  const int64_t count = static_cast<int64_t>(chunks.size());
  at::parallel_for(0, count, units_per_task(lists, count), [&](int64_t first, int64_t last) {
    bool finite = true;
    for (int64_t c = first; c < last; ++c) {
      const auto tensor_op = op.at_tensor(chunks[c].tensor);
      if (tensor_op.skip()) continue;
      partials[c] = run_chunk<D, M>(lists, chunks[c], tensor_op, finite);
      // A non-finite reduction partial (an inf/nan input, or a sum that overflowed) sets the flag, as in apex.
      if (Op::kReduce != Reduce::kNone && !VecMath<M>::isfinite(partials[c])) finite = false;
    }
    if (!finite) saw_nonfinite.store(true, std::memory_order_relaxed);
  });
  if (saw_nonfinite.load()) *flag = 1;
  return partials;
}

}  // namespace cpu_detail

struct CpuEngine {
  // Applies elementwise functor `op` to every element of the lists (TL: the lists' depth and math type).
  template <class TL, class Op>
  static void elementwise(const Cpu&, const TensorLists& lists, int* flag, const Op& op) {
    cpu_detail::run_all<TL::kDepth, typename TL::Math>(lists, flag, op, cpu_detail::split_into_chunks(lists));
  }

  // Reduces the terms `op` returns (sum of squares -> L2 norm, or max of |x|), in total and per tensor.
  template <class TL, class Op>
  static void reduce(const Cpu&, const TensorLists& lists, int* flag, const Op& op, const NormOut& out) {
    const auto chunks = cpu_detail::split_into_chunks(lists);
    const auto partials = cpu_detail::run_all<TL::kDepth, typename TL::Math>(lists, flag, op, chunks);
    const bool zero = out.zero_if_flag_set && *flag != 0;
    std::vector<float> per_tensor(static_cast<size_t>(lists.count), 0.f);
    for (size_t c = 0; c < chunks.size(); ++c) {
      float& slot = per_tensor[static_cast<size_t>(chunks[c].tensor)];
      slot = combine_partials<Op::kReduce>(slot, static_cast<float>(partials[c]));
    }
    float total = 0.f;
    for (int64_t t = 0; t < lists.count; ++t) {
      const float value = zero ? 0.f : per_tensor[static_cast<size_t>(t)];
      total = combine_partials<Op::kReduce>(total, value);
      if (out.mode != PerTensorOut::kNone) {
        out.per_tensor[t] = per_tensor_result<Op::kReduce>(out.mode, out.per_tensor[t], value, out.keep, out.take);
      }
    }
    *out.total = finish_norm<Op::kReduce>(total);
  }

  // Per-tensor sums of the terms `op` returns (Sums<Vec, kSums> per element) over every element of
  // the lists: sums[t * kSums + k], added per chunk and then in chunk order. `op` may write lists.
  template <class TL, int kSums, class Op>
  static void tensor_sums(const Cpu&, const TensorLists& lists, const Op& op, float* /*scratch*/, float* sums) {
    using M = typename TL::Math;
    using Vec = at::vec::Vectorized<M>;
    constexpr int D = TL::kDepth;
    const auto chunks = cpu_detail::split_into_chunks(lists);
    const int64_t count = static_cast<int64_t>(chunks.size());
    std::vector<M> partials(chunks.size() * kSums, M(0));
    at::parallel_for(0, count, cpu_detail::units_per_task(lists, count), [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        const cpu_detail::Chunk& chunk = chunks[c];
        const auto tensor_op = op.at_tensor(chunk.tensor);
        if (tensor_op.skip()) continue;
        Vec acc[kSums];
        for (Vec& a : acc) a = Vec(0);
        cpu_detail::for_each_vector<D, M>(
            lists, chunk.tensor, chunk.begin, chunk.end, tensor_op.reads(), tensor_op.writes(),
            [&](Vec (&x)[D], int lanes) {
              const auto terms = cpu_detail::call_op(tensor_op, x, std::make_index_sequence<D>{});
              for (int k = 0; k < kSums; ++k) acc[k] = acc[k] + Vec::set(Vec(0), terms.v[k], lanes);
            });
        for (int k = 0; k < kSums; ++k) partials[c * kSums + k] = cpu_detail::lane_sum(acc[k]);
      }
    });
    std::fill(sums, sums + lists.count * kSums, 0.f);
    for (int64_t c = 0; c < count; ++c) {
      for (int k = 0; k < kSums; ++k) sums[chunks[c].tensor * kSums + k] += static_cast<float>(partials[c * kSums + k]);
    }
  }

  // Runs a one-off scalar update (amp's loss-scale bookkeeping) on the host.
  template <class F>
  static void run_once(const Cpu&, const F& f) {
    f();
  }
};

}  // namespace apex::multi_tensor
