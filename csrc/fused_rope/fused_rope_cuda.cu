// fused_rotary_positional_embedding: the CUDA kernel. No shared memory and no barrier: a thread owns
// one unit of a token (kVec rotated pairs, or kVec copied dims; rope_plan.h) and walks that token's
// heads, which all share the token's position and so the unit's cos/sin. Per token it issues the
// loads of its first kHeadsInFlight heads, computes its unit's cos/sin into registers while they are
// in flight, then rotates and stores, batch after batch. Why (the previous kernel, a block per token
// with the token's cos/sin in shared memory between two barriers, reached 50-84% of copy bandwidth
// on an H100, issue/latency bound with DRAM 21-29% busy: the trig came before the loads and every
// warp of a block waited for it):
//  - trig work per token is unchanged (each rotated dim's sincos once, not once per head), but it
//    overlaps the token's first loads and no warp waits for another;
//  - one sincosf per angle instead of cosf + sinf (one range reduction instead of two), and one per
//    pair whose two dims have the same angle bits (the usual cat(f, f) and repeat_interleave(f, 2)
//    tables). sincosf gives the bits of cosf and sinf (same reduction and polynomials in the PTX),
//    so results are unchanged. A cheaper reduction (Cody-Waite by 2 pi, then __sincosf) would be
//    off by up to ~5e-7: at the tests' 16-bit tolerances (1e-3 for half) such a change of cos flips
//    its rounding to half for ~1e-3 of the table and can fail outputs that cancel, so it is not used.
//    sincosf's own fast path written inline, without the Payne-Hanek reduction behind each call (same
//    bits; 116 registers instead of 125, the same 2 blocks an SM), was 0-1.3% slower on an H200: the
//    trig's instruction count is not what limits this kernel, its bytes in flight are (benchmarks/
//    transformer/NOTES.md, session 30);
//  - per-token index work is additions: (i0, i1) advances by a precomputed quotient and remainder,
//    units and dims are 32-bit ints, no division per element (64-bit offsets for the pointers only,
//    so >2^31-element tensors still work);
//  - 16-bit data rotates in packed half2/bfloat162 arithmetic (two values per instruction, no
//    conversions), which gives exactly the float formula's results (see Packed).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>

#include "apex/cuda.cuh"
#include "apex/dependent_launch.cuh"
#include "apex/occupancy.cuh"
#include "fused_rope.h"
#include "rope_math.h"
#include "rope_plan.h"

namespace apex::fused_rope {
namespace {

// Heads whose vectors a thread has in flight at once: 4 heads x 2 vectors x 16 bytes = 128 bytes per
// thread, 4 KB per warp, 64 KB per SM at 16 resident warps: ~3-4x the 15-20 KB per SM that keeps an
// H100's DRAM busy (3.35 TB/s x 0.6-0.8 us loaded latency / 132 SMs), enough that warps busy with
// their trig or stores do not starve it. 8 would take 32 more registers (past 128: one block per SM);
// 2 does not fit 80 registers either (ptxas spills), so it would only halve the bytes in flight.
constexpr int kHeadsInFlight = 4;
// At most 128 registers per thread (sm_90 ptxas: 123-125 for the vector kernels, no spills), so that two
// 256-thread blocks (16 warps) stay resident per SM.
constexpr int kMinBlocksPerSm = 2;

// Packed 16-bit arithmetic (CUDA; ROCm takes the float path, which computes the same values).
#if defined(USE_ROCM)
constexpr bool kPackedMath = false;
#else
constexpr bool kPackedMath = true;
#endif

// What the kernel needs beyond RopeArgs, worked out once on the host.
struct Plan {
  UnitMap map;
  int heads_per_group;
  bool tokens32;          // outer1 and image_width fit 32-bit division (the 2-D image's per-token y, x)
  bool table_vectors[2];  // per section: its table's rows are 16-byte aligned (cos and sin alike)
};

// ---- tables ---------------------------------------------------------------------------------------

// Entries [index, index + N) of a table array (float32, or T) as floats: 16-byte loads where the host
// found the array and its rows aligned (`vectors`; index is then a multiple of the vector width:
// the unit's first column is a multiple of kVec, which is the vector width or a multiple of 4).
template <class T, int N>
C10_DEVICE C10_ALWAYS_INLINE void load_run(const void* data, bool f32, int64_t index, bool vectors, float (&v)[N]) {
  if (std::is_same_v<T, float> || f32) {
    const float* p = static_cast<const float*>(data);
    if constexpr (N % 4 == 0) {
      if (vectors) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
          const float4 w = __ldg(reinterpret_cast<const float4*>(p + index + 4 * i));
          v[4 * i] = w.x, v[4 * i + 1] = w.y, v[4 * i + 2] = w.z, v[4 * i + 3] = w.w;
        }
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __ldg(p + index + i);
  } else if constexpr (sizeof(T) == 2) {
    const T* p = static_cast<const T*>(data);
    constexpr int W = vector_width<T>();
    if constexpr (N % W == 0) {
      if (vectors) {
#pragma unroll
        for (int i = 0; i < N / W; ++i) {
          const uint4 bits = __ldg(reinterpret_cast<const uint4*>(p + index + W * i));
          AlignedVector<T, W> w;
          memcpy(&w, &bits, sizeof(w));
#pragma unroll
          for (int k = 0; k < W; ++k) v[W * i + k] = static_cast<float>(w.value[k]);
        }
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      v[i] = static_cast<float>(T(__ldg(reinterpret_cast<const unsigned short*>(p) + index + i), T::from_bits()));
    }
  }
}

// ---- the rotation ---------------------------------------------------------------------------------
//
// Both paths compute, per element of vector a and of vector b,
//   out = round(round(x * own) + round(partner * other))
// where partner is the element's pair mate (half-split and kVec == 1: the same element of the other
// vector; interleaved: the adjacent element of the same vector) and (own, other) its coefficients:
//   role a (first of the pair):  (cos_a, forward ? -sin_a : sin_b)
//   role b (second):             (cos_b, forward ?  sin_b : -sin_a)
// which is rope_math.h's rotate_pair with the sign folded into the coefficient (rounding commutes
// with negation), so forward and backward are one code path. kInterleaved is a template argument:
// the layouts differ in which element holds which coefficient, and one branch per unit (not one
// per value) keeps a single layout's registers live.

// The float formula (float32 data; 16-bit data on ROCm or on the kVec == 1 path).
template <class T, int kVec, bool kInterleaved>
struct FloatCoefficients {
  static constexpr bool kWithin = kInterleaved && kVec > 1;  // pair mates in the same vector
  float own_a[kVec], other_a[kVec], own_b[kVec], other_b[kVec];

  // Pair p < kVec (a constant once unrolled): roles a (own ca, other oa) and b (own cb, other ob).
  C10_DEVICE C10_ALWAYS_INLINE void set(int p, float ca, float oa, float cb, float ob) {
    if constexpr (kWithin) {  // pair p is elements (2p, 2p + 1) of a (p < kVec / 2), else of b
      const int e = 2 * (p % (kVec / 2));
      float* own = p < kVec / 2 ? own_a : own_b;
      float* other = p < kVec / 2 ? other_a : other_b;
      own[e] = ca, other[e] = oa, own[e + 1] = cb, other[e + 1] = ob;
    } else {  // element p of a and of b
      own_a[p] = ca, other_a[p] = oa, own_b[p] = cb, other_b[p] = ob;
    }
  }

  C10_DEVICE C10_ALWAYS_INLINE void rotate(AlignedVector<T, kVec>& a, AlignedVector<T, kVec>& b) const {
    float xa[kVec], xb[kVec];
#pragma unroll
    for (int m = 0; m < kVec; ++m) xa[m] = static_cast<float>(a.value[m]), xb[m] = static_cast<float>(b.value[m]);
#pragma unroll
    for (int m = 0; m < kVec; ++m) {
      const float pa = kWithin ? xa[m ^ 1] : xb[m], pb = kWithin ? xb[m ^ 1] : xa[m];
      a.value[m] = static_cast<T>(round_to<T>(xa[m] * own_a[m]) + round_to<T>(pa * other_a[m]));
      b.value[m] = static_cast<T>(round_to<T>(xb[m] * own_b[m]) + round_to<T>(pb * other_b[m]));
    }
  }
};

// Packed 16-bit arithmetic: half2 / bfloat162 with explicitly rounded multiplies and adds (the _rn
// forms, which nvcc never contracts into an FMA). Each product of two T values is exact in float
// (11 + 11 or 8 + 8 significant bits), so round(x * c) to T is the correctly rounded T product; the
// float sum of two T values rounded to T equals their correctly rounded T sum, because float has at
// least 2p + 1 significant bits for T's p (24 >= 23 for half, >= 17 for bfloat16: double rounding is
// then innocuous, Figueroa 1995). So the packed results are bit for bit the float formula's, which
// the 16-bit "matches the composite exactly" tests check on the GPU.
template <class T>
struct Packed;

#if !defined(USE_ROCM)
template <>
struct Packed<c10::Half> {
  using Pair = __half2;
  static C10_DEVICE C10_ALWAYS_INLINE Pair make(float lo, float hi) { return __floats2half2_rn(lo, hi); }
  static C10_DEVICE C10_ALWAYS_INLINE Pair mul(Pair x, Pair y) { return __hmul2_rn(x, y); }
  static C10_DEVICE C10_ALWAYS_INLINE Pair add(Pair x, Pair y) { return __hadd2_rn(x, y); }
  static C10_DEVICE C10_ALWAYS_INLINE Pair swap(Pair x) { return __lowhigh2highlow(x); }
};

template <>
struct Packed<c10::BFloat16> {
  using Pair = __nv_bfloat162;
  static C10_DEVICE C10_ALWAYS_INLINE Pair make(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
  static C10_DEVICE C10_ALWAYS_INLINE Pair mul(Pair x, Pair y) { return __hmul2_rn(x, y); }
  static C10_DEVICE C10_ALWAYS_INLINE Pair add(Pair x, Pair y) { return __hadd2_rn(x, y); }
  static C10_DEVICE C10_ALWAYS_INLINE Pair swap(Pair x) { return __lowhigh2highlow(x); }
};
#endif

// The coefficients as pairs of adjacent elements, packed as each pair's cos/sin comes (the floats
// already are T values, so packing rounds nothing).
template <class T, int kVec, bool kInterleaved>
struct PackedCoefficients {
  using P = Packed<T>;
  using Pair = typename P::Pair;
  Pair own_a[kVec / 2], other_a[kVec / 2], own_b[kVec / 2], other_b[kVec / 2];
  float held[4];  // half-split: the even pair, until the odd one completes the packs

  C10_DEVICE C10_ALWAYS_INLINE void set(int p, float ca, float oa, float cb, float ob) {
    if constexpr (kInterleaved) {  // pair p is elements (2p, 2p + 1) of a (p < kVec / 2), else of b
      const int i = p % (kVec / 2);
      if (p < kVec / 2) {
        own_a[i] = P::make(ca, cb), other_a[i] = P::make(oa, ob);
      } else {
        own_b[i] = P::make(ca, cb), other_b[i] = P::make(oa, ob);
      }
    } else if (p % 2 == 0) {  // elements p of a and of b, packed with p + 1's
      held[0] = ca, held[1] = oa, held[2] = cb, held[3] = ob;
    } else {
      const int i = p / 2;
      own_a[i] = P::make(held[0], ca), other_a[i] = P::make(held[1], oa);
      own_b[i] = P::make(held[2], cb), other_b[i] = P::make(held[3], ob);
    }
  }

  // a, b: kVec values as kVec / 2 32-bit words (see Raw).
  C10_DEVICE C10_ALWAYS_INLINE void rotate(AlignedVector<uint32_t, kVec / 2>& a,
                                           AlignedVector<uint32_t, kVec / 2>& b) const {
    static_assert(sizeof(Pair) == sizeof(uint32_t));
    Pair xa[kVec / 2], xb[kVec / 2], oa[kVec / 2], ob[kVec / 2];
    memcpy(xa, a.value, sizeof(xa));
    memcpy(xb, b.value, sizeof(xb));
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      const Pair pa = kInterleaved ? P::swap(xa[i]) : xb[i], pb = kInterleaved ? P::swap(xb[i]) : xa[i];
      oa[i] = P::add(P::mul(xa[i], own_a[i]), P::mul(pa, other_a[i]));
      ob[i] = P::add(P::mul(xb[i], own_b[i]), P::mul(pb, other_b[i]));
    }
    memcpy(a.value, oa, sizeof(oa));
    memcpy(b.value, ob, sizeof(ob));
  }
};

template <class T, int kVec>
constexpr bool kPacked = kPackedMath && sizeof(T) == 2 && kVec % 2 == 0;

template <class T, int kVec, bool kInterleaved>
using Coefficients = std::conditional_t<kPacked<T, kVec>, PackedCoefficients<T, kVec, kInterleaved>,
                                        FloatCoefficients<T, kVec, kInterleaved>>;

// Pair p's coefficients from its cos and sin at its dims a and b (the signs of the table above).
template <class Coefficients>
C10_DEVICE C10_ALWAYS_INLINE void set_pair(Coefficients& k, int p, float ca, float sa, float cb, float sb,
                                           bool backward) {
  k.set(p, ca, backward ? sb : -sa, cb, backward ? -sa : sb);
}

// The unit's coefficients: the kVec pairs' cos and sin (rounded to T, as cos_sin in rope_math.h) at
// row `pos` of the section's table, from column col_a (role a; half-split: col_b for role b,
// interleaved: 2 * kVec adjacent columns, a at the even ones). Angle tables take one sincosf per
// angle, and one per pair whose two angles are the same bits (equal inputs give equal outputs, so
// only the work changes: the usual tables, cat(f, f) and repeat_interleave(f, 2), are all such pairs).
template <class T, int kVec, bool kInterleaved>
C10_DEVICE C10_ALWAYS_INLINE void unit_coefficients(const Table& t, bool vectors, int64_t pos, int col_a, int col_b,
                                                    bool backward, Coefficients<T, kVec, kInterleaved>& k) {
  const bool f32 = t.dtype == Dtype::kFloat32;
  const int64_t row = pos * t.row_stride;
  const auto read = [&](const void* data, float(&a)[kVec], float(&b)[kVec]) {
    if constexpr (kInterleaved) {
      float run[2 * kVec];
      load_run<T, 2 * kVec>(data, f32, row + col_a, vectors, run);
#pragma unroll
      for (int p = 0; p < kVec; ++p) a[p] = run[2 * p], b[p] = run[2 * p + 1];
    } else {
      load_run<T, kVec>(data, f32, row + col_a, vectors, a);
      load_run<T, kVec>(data, f32, row + col_b, vectors, b);
    }
  };
  float first_a[kVec], first_b[kVec], sin_a[kVec], sin_b[kVec];  // cos or angles; sin (cached tables)
  read(t.cos, first_a, first_b);
  const bool cached = t.sin != nullptr;
  if (cached) read(t.sin, sin_a, sin_b);
#pragma unroll
  for (int p = 0; p < kVec; ++p) {
    float ca, sa, cb, sb;
    if (cached) {
      ca = first_a[p], sa = sin_a[p], cb = first_b[p], sb = sin_b[p];
    } else {
      sincosf(first_a[p], &sa, &ca);
      if (__float_as_uint(first_b[p]) == __float_as_uint(first_a[p])) {
        cb = ca, sb = sa;
      } else {
        sincosf(first_b[p], &sb, &cb);
      }
    }
    set_pair(k, p, round_to<T>(ca), round_to<T>(sa), round_to<T>(cb), round_to<T>(sb), backward);
  }
}

// cos 1, sin 0: the identity rotation, through the same formula as a real one (as the CPU kernel).
template <int kVec, class Coefficients>
C10_DEVICE C10_ALWAYS_INLINE void identity_coefficients(bool backward, Coefficients& k) {
#pragma unroll
  for (int p = 0; p < kVec; ++p) set_pair(k, p, 1.0f, 0.0f, 1.0f, 0.0f, backward);
}

// ---- memory ---------------------------------------------------------------------------------------

// A vector of x as the kernel holds it: 16-bit values for the packed path as 32-bit words (as an
// array of c10::Half / c10::BFloat16, nvcc kept each value in a register of its own and repacked
// them: twice the registers, and a PRMT per value), else as values.
template <class T, int kVec>
using Raw = std::conditional_t<kPacked<T, kVec>, AlignedVector<uint32_t, std::max(kVec / 2, 1)>,
                               AlignedVector<T, kVec>>;

template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE Raw<T, kVec> load(const T* x, int e, int64_t stride_d) {
  if constexpr (kVec == 1) {
    return {x[e * stride_d]};
  } else {
    return *reinterpret_cast<const Raw<T, kVec>*>(x + e);  // the vector path has stride_d == 1
  }
}

// One 16-byte store instruction per vector: nvcc split the plain struct store of these vectors
// (words or floats) into four st.global.u32 here (seen in the SASS), as aligned_vector.cuh's
// store_vector notes for 16-bit values.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void store(T* out, int e, const Raw<T, kVec>& v) {
  if constexpr (kVec == 1) {
    out[e] = v.value[0];
  } else {
    static_assert(sizeof(v) == kVectorBytes);
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
    uint32_t w[4];
    memcpy(w, &v, sizeof(w));
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(out + e), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
#else
    *reinterpret_cast<Raw<T, kVec>*>(out + e) = v;
#endif
  }
}

template <class Vector>
C10_DEVICE C10_ALWAYS_INLINE Vector select(bool first, const Vector& x, const Vector& y) {
  Vector v;
#pragma unroll
  for (size_t k = 0; k < sizeof(v.value) / sizeof(v.value[0]); ++k) v.value[k] = first ? x.value[k] : y.value[k];
  return v;
}

// Section s's table without indexing the kernel's parameters by a runtime value (which would copy
// them to local memory).
C10_DEVICE C10_ALWAYS_INLINE Table table_of(const RopeArgs& a, int s) { return s == 0 ? a.tables[0] : a.tables[1]; }

// Where token (i0, i1) sits in the tables: rope_math.h's token_positions, with the 2-D image's
// division in 32 bits where it fits.
C10_DEVICE C10_ALWAYS_INLINE TokenPositions positions_of(const RopeArgs& a, const Plan& plan, int64_t i0, int64_t i1) {
  if (a.positions == Positions::kImage && plan.tokens32) {
    const uint32_t i = static_cast<uint32_t>(i1), w = static_cast<uint32_t>(a.image_width);
    const uint32_t y = i / w;
    return {{y, i - y * w}, true};
  }
  return token_positions(a, i0, i1);
}

// ---- the kernel -----------------------------------------------------------------------------------

// One unit of one token, for heads [h_begin, h_end).
template <class T, int kVec, bool kInterleaved>
C10_DEVICE C10_ALWAYS_INLINE void rope_unit(const RopeArgs& a, const Plan& plan, const Unit& u,
                                            const TokenPositions& where, const T* x_token, T* out_token,
                                            int h_begin, int h_end) {
  // A copied unit reads its vector twice (one load, merged) and runs the rotation with identity
  // coefficients, discarding the result: the warp's lanes (rotated and copied units mix in a warp
  // when the rotary dim is partial) then take one path, with no branch around the loads.
  const int eb = u.rotated ? u.eb : u.ea;
  Raw<T, kVec> va[kHeadsInFlight], vb[kHeadsInFlight];
  // The loads of heads h.. (nothing needs them before the rotation). Past the last head the last
  // head is read again (a cache hit, not stored), so that the loads need no branch.
  const auto load_batch = [&](int h) {
#pragma unroll
    for (int j = 0; j < kHeadsInFlight; ++j) {
      const T* x = x_token + static_cast<int64_t>(min(h + j, h_end - 1) - h_begin) * a.x_stride_h;
      va[j] = load<T, kVec>(x, u.ea, a.x_stride_d);
      vb[j] = load<T, kVec>(x, eb, a.x_stride_d);
    }
  };
  const auto store_batch = [&](int h, const Coefficients<T, kVec, kInterleaved>& coefficients) {
#pragma unroll
    for (int j = 0; j < kHeadsInFlight; ++j) {
      Raw<T, kVec> oa = va[j], ob = vb[j];
      coefficients.rotate(oa, ob);
      if (h + j < h_end) {
        T* out = out_token + static_cast<int64_t>(h + j - h_begin) * a.out_stride_h;
        store<T, kVec>(out, u.ea, select(u.rotated, oa, va[j]));
        if (u.rotated) store<T, kVec>(out, u.eb, ob);
      }
    }
  };
  load_batch(h_begin);
  // The unit's cos/sin while the first batch is in flight.
  Coefficients<T, kVec, kInterleaved> coefficients;
  if (u.rotated && where.valid) {
    const Table table = table_of(a, u.section);
    const int64_t pos = u.section == 0 ? where.pos[0] : where.pos[1];
    CUDA_KERNEL_ASSERT(pos >= 0 && pos < table.rows && "RoPE position outside the table");
    const int base = u.section * plan.map.width;  // the unit's columns in its section's table
    unit_coefficients<T, kVec, kInterleaved>(table, u.section == 0 ? plan.table_vectors[0] : plan.table_vectors[1],
                                             pos, u.ea - base, u.eb - base, a.backward, coefficients);
  } else {  // no position: the identity rotation (an exact copy); copied units: unused
    identity_coefficients<kVec>(a.backward, coefficients);
  }
  store_batch(h_begin, coefficients);
  for (int h = h_begin + kHeadsInFlight; h < h_end; h += kHeadsInFlight) {
    load_batch(h);
    store_batch(h, coefficients);
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocksPerSm) rope_kernel(const RopeArgs a, const Plan plan) {
  // A programmatic dependent launch (launch_rope): this grid may start while the stream's previous
  // kernel finishes, so it waits for that kernel before touching memory, and lets the next kernel's
  // blocks take SMs as its own retire (its one wave ends unevenly; back to back, as RoPE runs on q
  // then k, the next call's start-up then overlaps this call's tail).
  cuda::start_dependent_kernel();
  const UnitMap& map = plan.map;
  const int64_t tokens = a.outer0 * a.outer1;
  const int h_begin = static_cast<int>(blockIdx.y) * plan.heads_per_group;
  const int h_end = min(static_cast<int>(a.heads), h_begin + plan.heads_per_group);

  // This thread's tokens: token, token + step, ..; (i0, i1) advances by step's quotient and remainder.
  int64_t token = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (token >= tokens) return;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  int64_t i0 = token / a.outer1, i1 = token - i0 * a.outer1;  // divisions once per thread
  const int64_t step0 = step / a.outer1, step1 = step - step0 * a.outer1;

  for (; token < tokens; token += step) {
    const TokenPositions where = positions_of(a, plan, i0, i1);
    const T* x_token = static_cast<const T*>(a.x) + i0 * a.x_stride0 + i1 * a.x_stride1 + h_begin * a.x_stride_h;
    T* out_token = static_cast<T*>(a.out) + i0 * a.out_stride0 + i1 * a.out_stride1 + h_begin * a.out_stride_h;
    for (int k = threadIdx.x; k < map.units; k += blockDim.x) {
      const Unit u = unit_at(map, k);
      if (kVec > 1 && map.interleaved) {  // (kVec == 1: interleaved pairs are the half-split unit's)
        rope_unit<T, kVec, true>(a, plan, u, where, x_token, out_token, h_begin, h_end);
      } else {
        rope_unit<T, kVec, false>(a, plan, u, where, x_token, out_token, h_begin, h_end);
      }
    }
    i0 += step0;
    i1 += step1;
    if (i1 >= a.outer1) i1 -= a.outer1, ++i0;
  }
}

// Whether every access of the kVec-wide path is a whole aligned 16-byte vector.
template <int kVec>
bool vector_path(const RopeArgs& a) {
  const int64_t rotated = a.sections * a.width;
  if (a.x_stride_d != 1 || (a.width / 2) % kVec != 0 || (a.dim - rotated) % kVec != 0) return false;
  for (const int64_t stride : {a.x_stride0, a.x_stride1, a.x_stride_h, a.out_stride0, a.out_stride1, a.out_stride_h}) {
    if (stride % kVec != 0) return false;
  }
  return is_aligned(a.x) && is_aligned(a.out);
}

// Whether a table's rows can be read as 16-byte vectors (arrays aligned, row stride a whole number of vectors).
bool table_vectors(const Table& t, size_t element_size) {
  const size_t bytes = t.dtype == Dtype::kFloat32 ? 4 : element_size;
  const bool rows = (t.row_stride * static_cast<int64_t>(bytes)) % kVectorBytes == 0;
  return rows && is_aligned(t.cos) && (t.sin == nullptr || is_aligned(t.sin));
}

template <class T, int kVec>
void launch_rope(const RopeArgs& a, const Cuda& device) {
  const int64_t tokens = a.outer0 * a.outer1;
  Plan plan{};
  plan.map = unit_map(kVec, a.dim, a.width, a.sections, a.interleaved);
  plan.tokens32 = a.outer1 <= UINT32_MAX && (a.positions != Positions::kImage || a.image_width <= UINT32_MAX);
  for (int s = 0; s < a.sections; ++s) plan.table_vectors[s] = table_vectors(a.tables[s], sizeof(T));
  LaunchPlan launch = block_shape(tokens, plan.map);
  const int per_sm = cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(rope_kernel<T, kVec>),
                                                  launch.cols * launch.rows, 0, device.device);
  grid_shape(tokens, a.heads, static_cast<int64_t>(cuda::device_limits(device.device).sms) * per_sm, launch);
  plan.heads_per_group = launch.heads_per_group;
  cuda::launch_dependent(device, rope_kernel<T, kVec>, dim3(launch.blocks, launch.groups), dim3(launch.cols, launch.rows),
                         0, cuda::stream(device), a, plan);
}

}  // namespace

void rope(const Cuda& device, const RopeArgs& args) {
  const int64_t tokens = args.outer0 * args.outer1;
  if (tokens == 0 || args.heads == 0 || args.dim == 0) return;
  // Dims, units and heads are ints in the kernel (offsets are 64-bit); unit_at knows 1 or 2 sections.
  if (args.dim > INT_MAX / 2 || args.heads > INT_MAX / 2 || args.sections < 1 || args.sections > 2) {
    throw std::invalid_argument("fused_rope: CUDA takes at most " + std::to_string(INT_MAX / 2) +
                                " heads and head dims and 1 or 2 sections, got " + std::to_string(args.heads) +
                                " heads, dim " + std::to_string(args.dim) + ", " + std::to_string(args.sections) +
                                " sections");
  }
  dispatch_floating<false>(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vector_width<T>();
    if (vector_path<kVec>(args)) {
      launch_rope<T, kVec>(args, device);
    } else {
      launch_rope<T, 1>(args, device);
    }
  });
  cuda::check_launch("fused_rope");
}

}  // namespace apex::fused_rope
