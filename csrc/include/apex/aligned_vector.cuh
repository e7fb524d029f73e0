#pragma once
// 16-byte vector accesses shared by every CUDA op: one LDG.128 / STG.128 per thread moves the
// most bytes per instruction, which memory-bound kernels need to reach copy bandwidth.

#include <c10/macros/Macros.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

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

// 16 bytes of 16-bit elements (c10::Half, c10::BFloat16) are stored by one explicit 16-byte store
// instruction. nvcc otherwise splits them: the struct copy into four st.global.v2.u16, a uint4 built
// from the same bits into four st.global.u32 (both seen in the PTX), and four store instructions per
// vector held the xentropy backward to a fifth of copy bandwidth (stalled on the LSU queue). The
// store is generic (shared or global memory) and a compiler barrier for memory, like any store.
template <int N, typename T>
C10_DEVICE C10_ALWAYS_INLINE void store_vector(T* base, int64_t offset, const AlignedVector<T, N>& vector) {
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  if constexpr (sizeof(T) == 2 && sizeof(vector) == 16) {
    uint32_t w[4];
    memcpy(w, &vector, sizeof(w));
    asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(base + offset), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                 "r"(w[3])
                 : "memory");
    return;
  }
#endif
  *reinterpret_cast<AlignedVector<T, N>*>(base + offset) = vector;
}

// 16 bytes stored by one st.global.v4.b32, for kernels whose output is known to be global memory
// (store_vector's store is generic): the xentropy 16-bit backward's packs, the SwiGLU one-shot
// kernels' vectors. `bits` are the 16 bytes as four words (uint4, CUDA's and HIP's vector type).
template <class Bits>
C10_DEVICE C10_ALWAYS_INLINE void store_global_16(void* p, const Bits& bits) {
  static_assert(sizeof(Bits) == 16, "16 bytes");
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(bits.x), "r"(bits.y), "r"(bits.z),
               "r"(bits.w)
               : "memory");
#else
  memcpy(p, &bits, sizeof(bits));
#endif
}

// A 16-byte vector through store_global_16.
template <int N, typename T>
C10_DEVICE C10_ALWAYS_INLINE void store_vector_global(T* p, const AlignedVector<T, N>& vector) {
  struct Words {
    uint32_t x, y, z, w;
  } bits;
  static_assert(sizeof(vector) == sizeof(bits), "16-byte vectors");
  memcpy(&bits, &vector, sizeof(bits));
  store_global_16(p, bits);
}

// A vector of N zeros (a pack written where there is nothing to compute).
template <typename T, int N>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, N> zeros() {
  AlignedVector<T, N> z;
#pragma unroll
  for (int k = 0; k < N; ++k) z.value[k] = T(0);
  return z;
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
