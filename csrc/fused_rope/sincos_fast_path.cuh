#pragma once
// sincosf's fast path (|x| < kSincosFastPathLimit), written out so that it inlines without the
// Payne-Hanek reduction that sincosf carries for larger arguments. The outputs must be sincosf's bits:
// the unfused composite that ROCm apex's RoPE tests compare against takes torch's cos and sin, which
// are sincosf's, and rounds them to 16 bits; a cos 1 ulp of float away rounds the other way for a few
// elements (a cheaper trig failed those tests, benchmarks/transformer/NOTES.md, session 29).
//
// The steps and constants are those of CUDA's sincosf (libdevice's __nv_sincosf in the PTX nvcc 13
// emits for sm_90): q = rint(x * 2/pi); r = x - q * pi/2 by three Cody-Waite FMAs; a degree-8 even
// polynomial for cos r and an odd one for sin r; swap and signs by q's low two bits. One change, with
// the same results: rint(x * 2/pi) by adding and subtracting 1.5 * 2^23 instead of two conversions
// (F2I and I2F issue at a quarter of the FMA rate on sm_90; the float additions at the full rate).
// For |p| < 2^22 (here |p| < 67300), p + 1.5 * 2^23 lies in [2^23, 2^24), where the float spacing is 1,
// so the rounded sum is 1.5 * 2^23 + rint(p) with ties to even, as cvt.rni's (1.5 * 2^23 is even);
// its low mantissa bits are rint(p)'s low bits. A GPU test checks the bits against sincosf's over
// a dense sweep of floats (tests/apex/transformer/functional/test_fused_rope.py).
#include <c10/macros/Macros.h>

namespace apex::fused_rope {

// sincosf takes its slow path for |x| >= this (and for infinities); NaN takes the fast path.
constexpr float kSincosFastPathLimit = 105615.0f;

// sin x and cos x for |x| < kSincosFastPathLimit or NaN, bit for bit sincosf's. Every operation is an
// explicitly rounded intrinsic, so nvcc contracts nothing that sincosf does not (the fma with a zero
// addend stays an fma: it is what gives sin(-0) its sign).
C10_DEVICE C10_ALWAYS_INLINE void sincos_fast_path(float x, float& s, float& c) {
  constexpr float kRound = 12582912.0f;                         // 1.5 * 2^23
  const float two_over_pi = __uint_as_float(0x3F22F983u);       // 2 / pi
  const float k = __fadd_rn(__fmul_rn(x, two_over_pi), kRound);  // 1.5 * 2^23 + rint(x * 2/pi)
  const float q = __fsub_rn(k, kRound);
  const unsigned quadrant = __float_as_uint(k);  // low two bits: rint(x * 2/pi) mod 4
  // r = x - q * pi/2, pi/2 as the sum of three floats.
  float r = __fmaf_rn(q, __uint_as_float(0xBFC90FDAu), x);
  r = __fmaf_rn(q, __uint_as_float(0xB3A22168u), r);
  r = __fmaf_rn(q, __uint_as_float(0xA7C234C5u), r);
  const float r2 = __fmul_rn(r, r);
  float cos_r = __fmaf_rn(__uint_as_float(0x37CBAC00u), r2, __uint_as_float(0xBAB607EDu));
  cos_r = __fmaf_rn(cos_r, r2, __uint_as_float(0x3D2AAABBu));
  cos_r = __fmaf_rn(cos_r, r2, __uint_as_float(0xBEFFFFFFu));
  cos_r = __fmaf_rn(cos_r, r2, 1.0f);
  const float r3 = __fmaf_rn(r2, r, 0.0f);
  float sin_r = __fmaf_rn(__uint_as_float(0xB94D4153u), r2, __uint_as_float(0x3C0885E4u));
  sin_r = __fmaf_rn(sin_r, r2, __uint_as_float(0xBE2AAAA8u));
  sin_r = __fmaf_rn(sin_r, r3, r);
  const bool odd = quadrant & 1u;
  const float sin_abs = odd ? cos_r : sin_r, cos_abs = odd ? sin_r : cos_r;
  s = (quadrant & 2u) == 0 ? sin_abs : -sin_abs;
  c = ((quadrant + 1u) & 2u) == 0 ? cos_abs : -cos_abs;
}

}  // namespace apex::fused_rope
