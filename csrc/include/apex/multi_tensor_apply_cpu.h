// CPU back end of the multi-tensor apply engine.
//
// Every tensor is cut into chunks of `chunk_size` elements; at::parallel_for spreads the
// chunks of all tensors over the threads. Inside a chunk, blocks of kBlock elements of each
// list are converted to the math type (float, or double for double lists) with ATen's
// vectorized converters, the functor runs on at::vec::Vectorized values, and written lists
// are converted back. Reductions keep one partial per chunk, so results do not depend on
// the number of threads.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <atomic>
#include <utility>

#include "apex/multi_tensor_apply_common.h"
#include "apex/multi_tensor_math.h"

namespace apex::multi_tensor {

template <class M>
struct VecMath<at::vec::Vectorized<M>> {
  using Vec = at::vec::Vectorized<M>;
  static Vec sqrt(const Vec& x) { return x.sqrt(); }
  static Vec abs(const Vec& x) { return x.abs(); }
  static Vec max(const Vec& a, const Vec& b) { return at::vec::maximum(a, b); }
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

struct Chunk {
  int tensor;
  int64_t begin, end;
};

inline std::vector<Chunk> split_into_chunks(at::TensorList tensors, int64_t chunk_elems) {
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t n = tensors[t].numel();
    for (int64_t begin = 0; begin < n; begin += chunk_elems) {
      chunks.push_back({static_cast<int>(t), begin, std::min(n, begin + chunk_elems)});
    }
  }
  return chunks;
}

// Runs `op` over [begin, end) of tensor `t`. Returns the chunk's reduction partial (0 for
// elementwise functors); clears `finite` if a checked input is inf/nan.
template <class TL, class Op>
typename TL::Math run_chunk(const std::vector<at::TensorList>& lists, const Chunk& chunk, const Op& op,
                            bool& finite) {
  using M = typename TL::Math;
  using Vec = at::vec::Vectorized<M>;
  constexpr int D = TL::kDepth;
  constexpr bool kReduces = Op::kReduce != Reduce::kNone;
  const ListMask reads = op.reads(), writes = op.writes(), checks = op.checks();

  void* base[D];
  for (int d = 0; d < D; ++d) base[d] = lists[d][chunk.tensor].data_ptr();

  alignas(64) M buf[D][kBlock];
  Vec acc(0), probe(0);
  for (int64_t b = chunk.begin; b < chunk.end; b += kBlock) {
    const int64_t n = std::min(kBlock, chunk.end - b);
    static_for<D>([&](auto I) {
      using T = typename TL::template At<I>;
      if (reads & (ListMask{1} << I)) at::vec::convert(static_cast<const T*>(base[I]) + b, buf[I], n);
    });
    for (int64_t i = 0; i < n; i += Vec::size()) {
      const int count = static_cast<int>(std::min<int64_t>(Vec::size(), n - i));
      Vec x[D];
      for (int d = 0; d < D; ++d) {
        // Unread lists are outputs the functor assigns; zero keeps them initialised.
        x[d] = (reads & (ListMask{1} << d)) ? Vec::loadu(buf[d] + i, count) : Vec(0);
        // x - x is NaN exactly for inf/nan inputs; loadu zero-fills lanes past `count`.
        if (checks & (ListMask{1} << d)) probe = probe + (x[d] - x[d]);
      }
      if constexpr (kReduces) {
        const Vec term = call_op(op, x, std::make_index_sequence<D>{});
        acc = Op::kReduce == Reduce::kMax ? VecMath<Vec>::max(acc, term) : acc + term;
      } else {
        call_op(op, x, std::make_index_sequence<D>{});
      }
      for (int d = 0; d < D; ++d) {
        if (writes & (ListMask{1} << d)) x[d].store(buf[d] + i, count);
      }
    }
    static_for<D>([&](auto I) {
      using T = typename TL::template At<I>;
      if (writes & (ListMask{1} << I)) at::vec::convert(buf[I], static_cast<T*>(base[I]) + b, n);
    });
  }
  if (checks) {
    alignas(64) M lanes[Vec::size()];
    probe.store(lanes);
    for (M lane : lanes) finite = finite && lane == M(0);
  }
  if constexpr (kReduces) {
    alignas(64) M lanes[Vec::size()];
    acc.store(lanes);
    M partial = 0;
    for (M lane : lanes) partial = Op::kReduce == Reduce::kMax ? VecMath<M>::max(partial, lane) : partial + lane;
    return partial;
  }
  return M(0);
}

// Runs `op` over every chunk in parallel; returns the per-chunk partials of a reduction.
template <class TL, class Op>
std::vector<typename TL::Math> run_all(const char* name, int64_t chunk_size, const at::Tensor& noop_flag,
                                       const std::vector<at::TensorList>& lists, const Op& op,
                                       std::vector<Chunk>& chunks) {
  APEX_CHECK(static_cast<int>(lists.size()) == TL::kDepth, name, ": expected ", TL::kDepth, " tensor lists, got ",
             lists.size());
  check_tensor_lists(name, chunk_size, noop_flag, lists);
  APEX_CHECK(noop_flag.is_cpu(), name, ": CPU kernel called with a flag on ", noop_flag.device());
  chunks = split_into_chunks(lists[0], round_up(chunk_size, kBlock));
  std::vector<typename TL::Math> partials(chunks.size(), 0);
  int* flag = noop_flag.data_ptr<int>();
  if (Op::kSkipIfFlagSet && *flag != 0) return partials;

  std::atomic<bool> saw_nonfinite{false};
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t first, int64_t last) {
    bool finite = true;
    for (int64_t c = first; c < last; ++c) {
      const auto tensor_op = op.at_tensor(chunks[c].tensor);
      if (tensor_op.skip()) continue;
      partials[c] = run_chunk<TL>(lists, chunks[c], tensor_op, finite);
      // A non-finite reduction partial (an inf/nan input, or a sum that overflowed) sets the flag, as in apex.
      if (Op::kReduce != Reduce::kNone && !VecMath<typename TL::Math>::isfinite(partials[c])) finite = false;
    }
    if (!finite) saw_nonfinite.store(true, std::memory_order_relaxed);
  });
  if (saw_nonfinite.load()) *flag = 1;
  return partials;
}

}  // namespace cpu_detail

struct CpuEngine {
  // Runs a one-off scalar update (amp's loss-scale bookkeeping) on the host.
  template <class F>
  static void run_once(const at::Tensor& /*on*/, const F& f) {
    f();
  }

  // Applies elementwise functor `op` to every element of the lists (element types TL).
  template <class TL, class Op>
  static void elementwise(const char* name, int64_t chunk_size, const at::Tensor& noop_flag,
                          const std::vector<at::TensorList>& lists, const Op& op) {
    std::vector<cpu_detail::Chunk> chunks;
    cpu_detail::run_all<TL>(name, chunk_size, noop_flag, lists, op, chunks);
  }

  // Reduces the terms `op` returns (sum of squares -> L2 norm, or max of |x|), in total and per tensor.
  template <class TL, class Op>
  static NormOutputs reduce(const char* name, int64_t chunk_size, const at::Tensor& noop_flag,
                            const std::vector<at::TensorList>& lists, const Op& op, const NormRequest& request) {
    std::vector<cpu_detail::Chunk> chunks;
    const auto partials = cpu_detail::run_all<TL>(name, chunk_size, noop_flag, lists, op, chunks);
    const int64_t num_tensors = static_cast<int64_t>(lists[0].size());
    NormOutputs out = allocate_norm_outputs(name, num_tensors, noop_flag, request);
    const bool zero = request.zero_if_flag_set && noop_flag.data_ptr<int>()[0] != 0;
    std::vector<float> per_tensor(num_tensors, 0.f);
    for (size_t c = 0; c < chunks.size(); ++c) {
      per_tensor[chunks[c].tensor] = combine_partials<Op::kReduce>(per_tensor[chunks[c].tensor], float(partials[c]));
    }
    float total = 0.f;
    float* per_tensor_out = out.per_tensor.numel() ? out.per_tensor.data_ptr<float>() : nullptr;
    for (int64_t t = 0; t < num_tensors; ++t) {
      const float value = zero ? 0.f : per_tensor[t];
      total = combine_partials<Op::kReduce>(total, value);
      if (per_tensor_out) {
        per_tensor_out[t] =
            per_tensor_result<Op::kReduce>(request.per_tensor, per_tensor_out[t], value, request.keep, request.take);
      }
    }
    out.total.data_ptr<float>()[0] = finish_norm<Op::kReduce>(total);
    return out;
  }
};

}  // namespace apex::multi_tensor
