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

// Host-side guard before choosing a vectorized launch.
inline bool is_aligned(const void* ptr, size_t alignment = kVectorBytes) {
  return reinterpret_cast<uintptr_t>(ptr) % alignment == 0;
}

}  // namespace apex
