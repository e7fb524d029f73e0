#pragma once
// 16-byte vector accesses shared by every CUDA op: one LDG.128 / STG.128 per thread moves the
// most bytes per instruction, which memory-bound kernels need to reach copy bandwidth.

#include <c10/macros/Macros.h>

#include <cstddef>
#include <cstdint>

namespace apex {

// Widest global load/store a thread issues in one instruction.
constexpr int kVectorBytes = 16;

// Elements of T in one 16-byte vector (4 floats, 8 halves, 2 doubles).
template <typename T>
constexpr int vector_width() {
  return kVectorBytes / static_cast<int>(sizeof(T));
}

// N values of T aligned to their total size, so that one access moves them all.
template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  T value[N];
};

template <int N, typename T>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, N> load_vector(const T* base, int64_t offset) {
  return *reinterpret_cast<const AlignedVector<T, N>*>(base + offset);
}

template <int N, typename T>
C10_DEVICE C10_ALWAYS_INLINE void store_vector(T* base, int64_t offset, const AlignedVector<T, N>& vector) {
  *reinterpret_cast<AlignedVector<T, N>*>(base + offset) = vector;
}

// One access group of a thread: the N elements base[i, i + N) as values of M, with one vector
// access when the group is `aligned` (base + i on an N * sizeof(T) boundary) and lies wholly before
// `end`; else element by element, elements at or past `end` read as 0 (a tensor's ragged tail).
template <int N, typename M, typename T>
C10_DEVICE C10_ALWAYS_INLINE void load_group(const T* base, int64_t i, int64_t end, bool aligned, M* values) {
  if (aligned && i + N <= end) {
    const auto vector = load_vector<N>(base, i);
#pragma unroll
    for (int k = 0; k < N; ++k) values[k] = static_cast<M>(vector.value[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) values[k] = i + k < end ? static_cast<M>(base[i + k]) : M(0);
  }
}

// The store twin of load_group: N values of M into base[i, i + N) as T, elements at or past `end` left alone.
template <int N, typename M, typename T>
C10_DEVICE C10_ALWAYS_INLINE void store_group(T* base, int64_t i, int64_t end, bool aligned, const M* values) {
  if (aligned && i + N <= end) {
    AlignedVector<T, N> vector;
#pragma unroll
    for (int k = 0; k < N; ++k) vector.value[k] = static_cast<T>(values[k]);
    store_vector<N>(base, i, vector);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (i + k < end) base[i + k] = static_cast<T>(values[k]);
    }
  }
}

// Host-side guard before choosing a vectorized launch.
inline bool is_aligned(const void* ptr, size_t alignment = kVectorBytes) {
  return reinterpret_cast<uintptr_t>(ptr) % alignment == 0;
}

}  // namespace apex
