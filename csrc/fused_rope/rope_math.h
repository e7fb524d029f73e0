#pragma once
// The RoPE formulas the CPU and CUDA kernels share (host and device), in float.
#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>

#include "fused_rope.h"

namespace apex::fused_rope {

// v rounded to T and back: what the unfused composite in dtype T rounds after every op (identity
// for float32).
template <class T>
C10_HOST_DEVICE C10_ALWAYS_INLINE float round_to(float v) {
  return static_cast<float>(static_cast<T>(v));
}

// One pair (a, b): see fused_rope.h. c*/s* are the table's cosines and sines (already rounded to T).
template <class T>
C10_HOST_DEVICE C10_ALWAYS_INLINE void rotate_pair(float xa, float xb, float ca, float sa, float cb, float sb,
                                                   bool backward, float& out_a, float& out_b) {
  if (backward) {
    out_a = round_to<T>(round_to<T>(xa * ca) + round_to<T>(xb * sb));
    out_b = round_to<T>(round_to<T>(xb * cb) - round_to<T>(xa * sa));
  } else {
    out_a = round_to<T>(round_to<T>(xa * ca) - round_to<T>(xb * sa));
    out_b = round_to<T>(round_to<T>(xb * cb) + round_to<T>(xa * sb));
  }
}

template <class T>
C10_HOST_DEVICE C10_ALWAYS_INLINE float table_value(const void* data, Dtype dtype, int64_t index) {
  return dtype == Dtype::kFloat32 ? static_cast<const float*>(data)[index]
                                  : static_cast<float>(static_cast<const T*>(data)[index]);
}

// cos and sin of dim e at position `pos` of `table`, rounded to T as the composite's
// `cos(freqs).to(T)` is.
template <class T>
C10_HOST_DEVICE C10_ALWAYS_INLINE void cos_sin(const Table& table, int64_t pos, int64_t e, float& c, float& s) {
  const int64_t index = pos * table.row_stride + e;
  if (table.sin == nullptr) {
    const float angle = table_value<T>(table.cos, table.dtype, index);
    c = ::cosf(angle);
    s = ::sinf(angle);
  } else {
    c = table_value<T>(table.cos, table.dtype, index);
    s = table_value<T>(table.sin, table.dtype, index);
  }
  c = round_to<T>(c);
  s = round_to<T>(s);
}

// Where token (i0, i1) sits in each section's table; false when it has no position (a packed
// token outside every sequence). The position is not range-checked here.
struct TokenPositions {
  int64_t pos[2];
  bool valid;
};

C10_HOST_DEVICE inline TokenPositions token_positions(const RopeArgs& a, int64_t i0, int64_t i1) {
  switch (a.positions) {
    case Positions::kSequence:
      return {{i0 + (a.offsets != nullptr ? a.offsets[i1] : 0), 0}, true};
    case Positions::kImage:
      return {{i1 / a.image_width, i1 % a.image_width}, true};
    case Positions::kPacked:
    default: {
      // The last sequence starting at or before t: binary search over cu_seqlens.
      if (a.sequences <= 0 || i0 < a.cu_seqlens[0] || i0 >= a.cu_seqlens[a.sequences]) return {{0, 0}, false};
      int64_t low = 0, high = a.sequences;  // cu_seqlens[low] <= t < cu_seqlens[high]
      while (high - low > 1) {
        const int64_t mid = (low + high) / 2;
        if (a.cu_seqlens[mid] <= i0) {
          low = mid;
        } else {
          high = mid;
        }
      }
      return {{i0 - a.cu_seqlens[low], 0}, true};
    }
  }
}

}  // namespace apex::fused_rope
