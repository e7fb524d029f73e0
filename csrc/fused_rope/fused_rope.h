#pragma once
// fused_rotary_positional_embedding: rotary positional embedding (RoPE) of [.., h, d] tokens and its
// backward, for the sbhd/bshd, packed (thd) and 2-D image layouts. What its kernel takes (one
// plain struct) and the kernel, one overload per device.
//
// The first `sections * width` dims of each head are rotated in pairs (a, b):
//   forward   out_a = x_a cos_a - x_b sin_a,   out_b = x_b cos_b + x_a sin_b
//   backward  dx_a  = g_a cos_a + g_b sin_b,   dx_b  = g_b cos_b - g_a sin_a   (the transpose)
// with pairs (j, j + width/2) per section (half-split, GPT-NeoX) or (2j, 2j + 1) (interleaved,
// GPT-J); cos/sin of dim e at the token's position come from that section's table. The remaining
// dims are copied. 16-bit data rounds each product and the sum to its dtype, exactly as the
// unfused `t * cos + rotate_half(t) * sin` does in that dtype (so the two agree bit for bit).
#include "apex/device.h"
#include "apex/dtype.h"

namespace apex::fused_rope {

// Angles (or their cosines and sines) by position: element e of position p at data[p * row_stride + e].
struct Table {
  const void* cos;     // the cached cosines; or the angles, when sin is null
  const void* sin;     // the cached sines; null: cos holds angles, whose sincos the kernel computes
  Dtype dtype;         // float32 or the data's dtype
  int64_t row_stride;
  int64_t rows;        // positions the table has (a position outside is an error)
};

enum class Positions : int8_t {
  kSequence,  // token (i0, i1) = (s, b): position s + offsets[b] (offsets may be null)
  kPacked,    // token (i0, 0) = t: position t - cu_seqlens[j] in the sequence j holding t
              // (a token in no sequence is copied unchanged)
  kImage,     // token (i0, i1) = (b, y * image_width + x): section 0 at position y, section 1 at x
};

// Token (i0, i1) of the [outer0, outer1] grid has heads x dim elements: x at
// x[i0 * x_stride0 + i1 * x_stride1 + h * x_stride_h + e * x_stride_d], out likewise with a unit
// dim stride.
struct RopeArgs {
  const void* x;
  void* out;
  Dtype dtype;
  int64_t outer0, outer1, heads, dim;
  int64_t x_stride0, x_stride1, x_stride_h, x_stride_d;
  int64_t out_stride0, out_stride1, out_stride_h;
  Positions positions;
  const int64_t* offsets;      // kSequence: [outer1], or null
  const int32_t* cu_seqlens;   // kPacked: [sequences + 1], non-decreasing
  int64_t sequences;
  int64_t image_width;         // kImage
  Table tables[2];             // one per section
  int sections;                // 1, or 2 for kImage
  int64_t width;               // rotated dims per section (even); sections * width <= dim
  bool interleaved;
  bool backward;
};

void rope(const Cpu&, const RopeArgs&);   // fused_rope_cpu.cpp
void rope(const Cuda&, const RopeArgs&);  // fused_rope_cuda.cu

}  // namespace apex::fused_rope
