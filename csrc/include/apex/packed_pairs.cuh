#pragma once
// Two floats <-> one 32-bit word of two 16-bit values (c10::Half or c10::BFloat16), low half first:
// one instruction each way per pair, where element-wise casts take two. Memory-bound kernels on
// 16-bit data are often bound by instruction issue as much as by bytes (an H200 at copy speed leaves
// ~32 thread-instructions per bf16 element read and written), so they keep their data as words
// and convert pairs.

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__) && !defined(USE_ROCM)
#include <cuda_fp16.h>
#endif

namespace apex {

// Two floats as one word of 16-bit T, `low` in the low half, each rounded to nearest even as
// static_cast<T> rounds: one cvt for both (sm_80 on).
template <typename T>
C10_DEVICE C10_ALWAYS_INLINE uint32_t pack_pair(float low, float high) {
  static_assert(sizeof(T) == 2, "pairs of 16-bit values");
  uint32_t out;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(USE_ROCM)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(high), "f"(low));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(high), "f"(low));
  }
#else
  const T pair[2] = {static_cast<T>(low), static_cast<T>(high)};
  memcpy(&out, pair, sizeof(out));
#endif
  return out;
}

// The two elements of a word of 16-bit T (low half first) in float: one instruction each.
template <typename T>
C10_DEVICE C10_ALWAYS_INLINE float2 unpack_pair(uint32_t w) {
  static_assert(sizeof(T) == 2, "pairs of 16-bit values");
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
#if defined(__CUDACC__) && !defined(USE_ROCM)
    __half2 h;
    memcpy(&h, &w, sizeof(h));
    return __half22float2(h);
#else
    T pair[2];
    memcpy(pair, &w, sizeof(w));
    return make_float2(static_cast<float>(pair[0]), static_cast<float>(pair[1]));
#endif
  }
}

}  // namespace apex
