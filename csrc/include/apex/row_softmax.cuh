#pragma once
// Block-per-row softmax machinery for rows of any length (vocabularies of 256K classes included):
// one pass over a row in 16-byte vectors for its online softmax statistics, and one pass writing
// a multiple of its softmax, exp(x - lse) recomputed per element (never a stored probability).
// Used by the cross-entropy (xentropy) and RNN-T (transducer) losses. Device code; include after
// apex/cuda.cuh and apex/block_reduce.cuh.
//
// exp(x - m) is computed as exp2(x * log2(e) - m * log2(e)): one FFMA and one MUFU.EX2 per element.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "apex/acc_type.h"

namespace apex::cuda {

template <class Acc>
constexpr Acc kLog2e = Acc(1.4426950408889634073599246810018921);
template <class Acc>
constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();

C10_DEVICE C10_ALWAYS_INLINE float exp2_of(float x) { return exp2f(x); }
C10_DEVICE C10_ALWAYS_INLINE double exp2_of(double x) { return exp2(x); }
// NaN-ignoring maxima: a NaN logit still reaches the sum of exps, and so the result.
C10_DEVICE C10_ALWAYS_INLINE float max_of(float a, float b) { return fmaxf(a, b); }
C10_DEVICE C10_ALWAYS_INLINE double max_of(double a, double b) { return fmax(a, b); }

// Softmax statistics of the part of a row seen so far (by a thread, then by the block).
template <class Acc>
struct Online {
  Acc max;      // largest logit seen (-inf: none yet)
  Acc sum_exp;  // sum of exp(x - max)
  Acc sum;      // sum of x (label smoothing's mean term)

  static C10_DEVICE Online empty() { return {kNegInf<Acc>, Acc(0), Acc(0)}; }

  // Raises the running max to m (a group's max), rescaling the sum taken at the old one. After
  // the first groups of a row the max rarely changes, so the exp is rarely paid.
  C10_DEVICE void raise_max(Acc m) {
    if (m > max) {
      sum_exp *= exp2_of((max - m) * kLog2e<Acc>);
      max = m;
    }
  }
  // x * log2e - base() is the exp2 argument of exp(x - max); 0 while the max is -inf, so that
  // -inf logits add exp2(-inf) = 0 rather than NaN.
  C10_DEVICE Acc base() const { return max == kNegInf<Acc> ? Acc(0) : max * kLog2e<Acc>; }
  C10_DEVICE void add(Acc x, Acc base) {
    sum_exp += exp2_of(x * kLog2e<Acc> - base);
    sum += x;
  }
  C10_DEVICE void absorb(Acc x) {
    raise_max(x);
    add(x, base());
  }
  // log(sum_j exp(x_j)): -inf for an empty or all -inf row.
  C10_DEVICE Acc log_sum_exp() const { return max + log(sum_exp); }
};

template <class Acc>
struct MergeOnline {
  C10_DEVICE Online<Acc> operator()(const Online<Acc>& a, const Online<Acc>& b) const {
    const Acc m = max_of(a.max, b.max);
    if (m == kNegInf<Acc>) return {m, Acc(0), a.sum + b.sum};
    return {m, a.sum_exp * exp2_of((a.max - m) * kLog2e<Acc>) + b.sum_exp * exp2_of((b.max - m) * kLog2e<Acc>),
            a.sum + b.sum};
  }
};

// A row as 16-byte accesses see it: `head` scalars up to the first 16-byte boundary, `packs`
// whole vectors of kVec, then scalars from tail() to the end.
struct RowSplit {
  int64_t head;
  int64_t packs;
  int kVec;
  C10_DEVICE int64_t tail() const { return head + packs * kVec; }
  // The thread of the block that handles element j in the loops below.
  C10_DEVICE int owner(int64_t j) const {
    const int64_t slot = j < head ? j : j >= tail() ? j - tail() : (j - head) / kVec;
    return static_cast<int>(slot % blockDim.x);
  }
};

template <class T, int kVec>
C10_DEVICE RowSplit split_row(const T* row, int64_t length) {
  if (kVec == 1) return {0, length, 1};
  const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row) % kVectorBytes / sizeof(T));
  const int64_t head = misaligned == 0 ? 0 : (kVec - misaligned < length ? kVec - misaligned : length);
  return {head, (length - head) / kVec, kVec};
}

// Calls f(j) for every scalar (head and tail) element of the row this thread handles.
template <class F>
C10_DEVICE void for_scalars(const RowSplit& split, int64_t length, F&& f) {
  for (int64_t j = threadIdx.x; j < split.head; j += blockDim.x) f(j);
  for (int64_t j = split.tail() + threadIdx.x; j < length; j += blockDim.x) f(j);
}

// Calls f(packs, count, first): `count` (<= kUnroll) vectors of this thread loaded from `body`,
// the u-th at vector index first + u * blockDim.x. Loads are all issued before f uses any.
template <int kUnroll, int kVec, class T, class F>
C10_DEVICE void for_packs(const T* body, int64_t packs, F&& f) {
  const int64_t step = blockDim.x;
  for (int64_t first = threadIdx.x; first < packs; first += kUnroll * step) {
    AlignedVector<T, kVec> loaded[kUnroll];
    int count = 0;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (first + u * step < packs) {
        loaded[u] = load_vector<kVec>(body, (first + u * step) * kVec);
        count = u + 1;
      }
    }
    f(loaded, count, first);
  }
}

// The softmax statistics of row x[0, length), merged over the block (valid in thread 0). Every
// thread of the block calls it; `scratch` holds one Online per warp.
template <int kUnroll, int kVec, class T, class Acc>
C10_DEVICE Online<Acc> row_statistics(const T* x, int64_t length, Online<Acc>* scratch) {
  const RowSplit split = split_row<T, kVec>(x, length);
  Online<Acc> state = Online<Acc>::empty();
  for_scalars(split, length, [&](int64_t j) { state.absorb(static_cast<Acc>(x[j])); });
  for_packs<kUnroll, kVec>(x + split.head, split.packs, [&](const AlignedVector<T, kVec>* packs, int count, int64_t) {
    Acc group_max = kNegInf<Acc>;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (u < count) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) group_max = max_of(group_max, static_cast<Acc>(packs[u].value[k]));
      }
    }
    state.raise_max(group_max);
    const Acc base = state.base();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (u < count) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) state.add(static_cast<Acc>(packs[u].value[k]), base);
      }
    }
  });
  return block_reduce(state, MergeOnline<Acc>{}, Online<Acc>::empty(), scratch);
}

// out[j] = scale * exp(x[j] - lse) - minus for the whole row (x and out equally aligned, or kVec 1).
// Elements a caller must change (a label's) are rewritten afterwards by split.owner(j), which wrote
// them: program order, no barrier.
template <int kUnroll, int kVec, class T, class Acc>
C10_DEVICE RowSplit write_scaled_softmax(const T* x, T* out, int64_t length, Acc lse, Acc scale, Acc minus) {
  const RowSplit split = split_row<T, kVec>(x, length);
  const Acc base = lse * kLog2e<Acc>;
  const auto value = [&](T logit) { return scale * exp2_of(static_cast<Acc>(logit) * kLog2e<Acc> - base) - minus; };
  for_scalars(split, length, [&](int64_t j) { out[j] = static_cast<T>(value(x[j])); });
  T* body = out + split.head;
  for_packs<kUnroll, kVec>(x + split.head, split.packs, [&](const AlignedVector<T, kVec>* packs, int count, int64_t first) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (u < count) {
        AlignedVector<T, kVec> result;
#pragma unroll
        for (int k = 0; k < kVec; ++k) result.value[k] = static_cast<T>(value(packs[u].value[k]));
        store_vector<kVec>(body, (first + u * static_cast<int64_t>(blockDim.x)) * kVec, result);
      }
    }
  });
  return split;
}

// out[0, length) = 0 (a row whose input is never read).
template <int kVec, class T>
C10_DEVICE void zero_row(T* out, int64_t length) {
  const RowSplit split = split_row<T, kVec>(out, length);
  for_scalars(split, length, [&](int64_t j) { out[j] = T(0); });
  AlignedVector<T, kVec> zeros;
#pragma unroll
  for (int k = 0; k < kVec; ++k) zeros.value[k] = T(0);
  for (int64_t p = threadIdx.x; p < split.packs; p += blockDim.x) store_vector<kVec>(out + split.head, p * kVec, zeros);
}

// Threads for a block per row of `length` elements: enough to cover a row in a few vector loads
// each, between min_threads and max_threads (powers of two).
template <class T>
unsigned row_threads(int64_t length, int unroll, int min_threads, int max_threads) {
  const int64_t packs = length / vector_width<T>() + 1;
  int threads = min_threads;
  while (threads < max_threads && static_cast<int64_t>(threads) * unroll < packs) threads *= 2;
  return static_cast<unsigned>(threads);
}

}  // namespace apex::cuda
