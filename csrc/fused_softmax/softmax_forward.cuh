#pragma once
// fused_softmax: the forward CUDA kernels, y = softmax(scale * x) over each row with masked columns
// taking no part (y = 0). Kernel shapes and the plan: softmax_cuda.cuh. Causal rows load only the
// columns up to the diagonal and write zeros past it without reading anything.
// forward_as<T> is instantiated once per dtype, each in a unit of its own (softmax_forward_<dtype>.cu),
// so that ninja compiles the dtypes in parallel: as one unit they were the op's slowest.
#include "apex/packed_pairs.cuh"
#include "softmax_cuda.cuh"

namespace apex::fused_softmax {
namespace {

// Where the i-th row a kernel handles lives. With a mask, rows go head-fastest ((b, q, h) order),
// so the heads sharing a mask row ([b, 1, sq, sk] masks) run back to back and find it in L2.
struct RowRef {
  int64_t offset;       // of the row's first element in x and y
  int64_t kept;         // columns past this are masked (causal); else cols
  const uint8_t* mask;  // the row's mask, or null
};

C10_DEVICE RowRef locate(const ForwardArgs& a, int64_t i) {
  if (a.mask == nullptr) {
    const int64_t q = i % a.queries;
    return {i * a.cols, a.causal ? std::min<int64_t>(q + 1, a.cols) : a.cols, nullptr};
  }
  const int64_t h = i % a.heads, q = (i / a.heads) % a.queries, b = i / (a.heads * a.queries);
  const int64_t row = (b * a.heads + h) * a.queries + q;
  return {row * a.cols, a.causal ? std::min<int64_t>(q + 1, a.cols) : a.cols,
          a.mask + b * a.mask_batch_stride + h * a.mask_head_stride + q * a.mask_query_stride};
}

// Bit k set: column col + k is kept (inside the causal bound and not masked).
template <int kVec>
C10_DEVICE C10_ALWAYS_INLINE uint32_t kept_bits(const RowRef& row, int64_t col) {
  uint32_t bits = 0;
  if (row.mask != nullptr) {
    const AlignedVector<uint8_t, kVec> masked = load_vector<kVec>(row.mask, col);
#pragma unroll
    for (int k = 0; k < kVec; ++k) bits |= (masked.value[k] == 0 && col + k < row.kept ? 1u : 0u) << k;
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) bits |= (col + k < row.kept ? 1u : 0u) << k;
  }
  return bits;
}

// v[k] = x[k] * scale (exp2 domain) where kept, -inf where not; returns the largest.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE float scaled(const AlignedVector<T, kVec>& x, uint32_t bits, float scale, float (&v)[kVec]) {
  float most = kNegInf;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    v[k] = (bits >> k & 1u) ? static_cast<float>(x.value[k]) * scale : kNegInf;
    most = fmaxf(most, v[k]);
  }
  return most;
}

// y of kept columns from their scaled value; zeros elsewhere (and for -inf scores).
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, kVec> probabilities(const AlignedVector<T, kVec>& x, uint32_t bits,
                                                                   float scale, const Stats& row) {
  const float inv = inverse_sum(row.sum);
  AlignedVector<T, kVec> y;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float v = static_cast<float>(x.value[k]) * scale;
    y.value[k] = static_cast<T>((bits >> k & 1u) && v != kNegInf ? exp2f(v - row.max) * inv : 0.0f);
  }
  return y;
}

// ---- warp and row kernels ----------------------------------------------------------------------

// A row by its (batch, head, query) indices; row_at and next_row walk the kernels' visiting order.
struct RowIndex {
  int64_t b, h, q;
};

// Whether the warp and row kernels visit rows head-fastest: the mask has one row per (b, q) shared
// by the heads, which consecutive rows then reuse (else storage order, (b, h, q)).
C10_DEVICE C10_ALWAYS_INLINE bool heads_share_mask(const ForwardArgs& a) {
  return a.mask != nullptr && a.mask_head_stride == 0 && a.heads > 1;
}

// The row visited t-th.
C10_DEVICE C10_ALWAYS_INLINE RowIndex row_at(const ForwardArgs& a, int64_t t, bool head_fastest) {
  RowIndex r;
  int64_t rest;
  if (head_fastest) {
    div_mod(t, a.heads, rest, r.h);
    div_mod(rest, a.queries, r.b, r.q);
  } else {
    div_mod(t, a.queries, rest, r.q);
    div_mod(rest, a.heads, r.b, r.h);
  }
  return r;
}

// The row visited after r (no division).
C10_DEVICE C10_ALWAYS_INLINE void next_row(const ForwardArgs& a, RowIndex& r, bool head_fastest) {
  if (head_fastest) {
    if (++r.h == a.heads) {
      r.h = 0;
      if (++r.q == a.queries) r.q = 0, ++r.b;
    }
  } else if (++r.q == a.queries) {
    r.q = 0;
    if (++r.h == a.heads) r.h = 0, ++r.b;
  }
}

C10_DEVICE C10_ALWAYS_INLINE int64_t row_offset(const ForwardArgs& a, const RowIndex& r) {
  return ((r.b * a.heads + r.h) * a.queries + r.q) * a.cols;
}

// Columns past this are masked by the causal bound.
C10_DEVICE C10_ALWAYS_INLINE int64_t row_kept(const ForwardArgs& a, const RowIndex& r) {
  return a.causal ? std::min<int64_t>(r.q + 1, a.cols) : a.cols;
}

C10_DEVICE C10_ALWAYS_INLINE const uint8_t* mask_row(const ForwardArgs& a, const RowIndex& r) {
  return a.mask + r.b * a.mask_batch_stride + r.h * a.mask_head_stride + r.q * a.mask_query_stride;
}

// ---- the warp and row kernels' element work ----------------------------------------------------
//
// The warp and row kernels take positive finite scales only (forward() sends any other to the block
// kernel). That lets an element which takes no part (masked, past the causal bound) be overwritten
// once, in the registers as loaded, by -inf: every pass after treats it as any other element. It
// cannot raise the max, and exp2(-inf * scale - base) = 0 adds nothing to the sum and writes y = 0,
// so no keep bits live across the passes and no select runs per element. -inf scores come out as
// before (their exponentials are 0), and a row whose sum is 0 (nothing kept) writes zeros. A row
// holding a NaN or +inf score (whose kept outputs are NaN) now writes NaN in its masked columns too,
// as torch's softmax of the masked scores does.
// The max is taken over the elements as loaded (16-bit elements two per max.bf16x2 / max.f16x2) and
// scaled once: multiplying by a positive float is monotonic, rounding included, so that is exactly
// the max of the scaled elements. Vectors wholly past the causal bound are skipped (zeros written).

// -inf in each element slot of a 32-bit word of T.
template <class T>
constexpr uint32_t neg_inf_bits() {
  if constexpr (sizeof(T) == 4) {
    return 0xff800000u;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return 0xff80ff80u;
  } else {
    return 0xfc00fc00u;
  }
}

// Each byte of the result is byte (selector nibble & 3) of x with its top bit copied to all eight
// bits, per nibble of `selector` (prmt's sign-replicating selectors: one instruction).
C10_DEVICE C10_ALWAYS_INLINE uint32_t replicate_top_bits(uint32_t x, uint32_t selector) {
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  uint32_t out;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(out) : "r"(x), "r"(selector));
  return out;
#else
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t byte = x >> (8 * ((selector >> (4 * i)) & 3u));
    out |= (byte & 0x80u ? 0xffu : 0u) << (8 * i);
  }
  return out;
#endif
}

// Which elements of a vector take no part: bit 7 of byte e set where element e is dropped, the other
// bits anything (replicate_top_bits turns such a byte into an element-wide mask).
template <int kVec>
struct Dropped {
  static constexpr int kWords = (kVec + 3) / 4;
  static constexpr uint32_t kFlags = 0x80808080u;
  uint32_t w[kWords];

  // The mask's nonzero bytes: bit 7 of ((b & 0x7f) + 0x7f) | b is set iff b != 0 (the 0x7f masks keep
  // each byte's sum inside its byte). Three instructions per four columns.
  static C10_DEVICE C10_ALWAYS_INLINE Dropped masked(const MaskBytes<kVec>& m) {
    Dropped d;
#pragma unroll
    for (int i = 0; i < kWords; ++i) d.w[i] = ((m.w[i] & 0x7f7f7f7fu) + 0x7f7f7f7fu) | m.w[i];
    return d;
  }
  // From bits (bit e: element e dropped, none above kVec): four bits times 0x10204080 put bit e at
  // 8e + 7 (the copies of nibble bit e shifted by 7 + 7j reach a byte's top bit only for j = e, and
  // copies 7 bits apart never carry into each other). Two instructions per four columns.
  static C10_DEVICE C10_ALWAYS_INLINE Dropped from_bits(uint32_t bits) {
    Dropped d;
#pragma unroll
    for (int i = 0; i < kWords; ++i) d.w[i] = ((bits >> (4 * i)) & 0xfu) * 0x10204080u;
    return d;
  }
  C10_DEVICE C10_ALWAYS_INLINE bool any() const {
    uint32_t flags = 0;
#pragma unroll
    for (int i = 0; i < kWords; ++i) flags |= w[i];
    return (flags & kFlags) != 0;
  }
};

// Bit e set: element e at or past `room` columns from the vector's first (all of them for room <= 0).
template <int kVec>
C10_DEVICE C10_ALWAYS_INLINE uint32_t bits_past(int room) {
  constexpr uint32_t kAll = (1u << kVec) - 1u;
  return (kAll << std::min(std::max(room, 0), kVec)) & kAll;
}

// store_vector(base, 0, v) where `condition` holds: 16-byte vectors by one predicated st.global.v4 (a
// branch around the store costs a reconvergence barrier where the condition differs between lanes).
template <int kVec, class T>
C10_DEVICE C10_ALWAYS_INLINE void store_vector_if(bool condition, T* base, const AlignedVector<T, kVec>& v) {
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  if constexpr (sizeof(v) == 16) {
    uint32_t w[4];
    memcpy(w, &v, sizeof(w));
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %5, 0; @p st.global.v4.b32 [%0], {%1, %2, %3, %4}; }" ::"l"(base),
        "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]), "r"(static_cast<uint32_t>(condition))
        : "memory");
    return;
  }
#endif
  if (condition) store_vector<kVec>(base, 0, v);
}

// Whether `condition` holds in any lane of the warp (every lane calls it and gets the same answer).
// Branching on it is uniform: ptxas then needs no reconvergence barrier (BSSY / BSYNC) around the
// body, which a per-lane condition costs each vector of each pass, and lanes without work in the body
// compute on -inf elements, which changes nothing.
C10_DEVICE C10_ALWAYS_INLINE bool warp_any(bool condition) {
#if defined(USE_ROCM)
  return __any(condition);
#else
  return __any_sync(0xffffffffu, condition);
#endif
}

// Overwrites the dropped elements of v with -inf: per 32-bit word one prmt (the mask) and one lop3.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void drop_elements(Packed<T, kVec>& v, const Dropped<kVec>& d) {
  constexpr int kPerWord = sizeof(T) == 4 ? 1 : 2;
#pragma unroll
  for (int i = 0; i < Packed<T, kVec>::kWords; ++i) {
    const int e = i * kPerWord;  // the word's first element
    const uint32_t first = 8u | static_cast<uint32_t>(e % 4), second = kPerWord == 2 ? first + 1u : first;
    const uint32_t selector = first * 0x0011u | second * 0x1100u;
    const uint32_t m = replicate_top_bits(d.w[e / 4], selector);
    v.w[i] = (v.w[i] & ~m) | (neg_inf_bits<T>() & m);
  }
}

// max of two pairs of 16-bit elements, lane by lane, ignoring NaN as fmaxf does (sm_80 on).
template <class T>
C10_DEVICE C10_ALWAYS_INLINE uint32_t max_pairs(uint32_t a, uint32_t b) {
  uint32_t out;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(USE_ROCM)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    asm("max.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  } else {
    asm("max.f16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  }
#else
  out = a;  // unused: LoadedMax takes the float path here
#endif
  return out;
}

// The largest element absorbed, as loaded (not scaled); -inf if none. Even 16-bit vectors on sm_80 on:
// two lanes of max_pairs, one instruction per two elements; elsewhere a float.
template <class T>
struct LoadedMax {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(USE_ROCM)
  static constexpr bool kPaired = sizeof(T) == 2;
#else
  static constexpr bool kPaired = false;
#endif
  uint32_t pairs = neg_inf_bits<T>();
  float single = kNegInf;

  template <int kVec>
  C10_DEVICE C10_ALWAYS_INLINE void absorb(const Packed<T, kVec>& v) {
    if constexpr (kPaired && kVec % 2 == 0) {
      uint32_t most = v.w[0];
#pragma unroll
      for (int i = 1; i < Packed<T, kVec>::kWords; ++i) most = max_pairs<T>(most, v.w[i]);
      pairs = max_pairs<T>(pairs, most);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) single = fmaxf(single, v[k]);
    }
  }
  // Whether absorb() converts vectors of kVec elements to float, as the sum pass does again after it:
  // then launder() them in between, or ptxas keeps the floats (twice the registers of 16-bit data).
  template <int kVec>
  static constexpr bool converts() {
    return sizeof(T) == 2 && !(kPaired && kVec % 2 == 0);
  }
  C10_DEVICE C10_ALWAYS_INLINE float value() const {
    if constexpr (kPaired) {
      Packed<T, 2> two;
      two.w[0] = pairs;
      return fmaxf(single, fmaxf(two[0], two[1]));
    } else {
      return single;
    }
  }
};

// sum + exp2(x * scale - base) over the vector's elements.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE float exp_sum(const Packed<T, kVec>& x, float scale, float base, float sum) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) sum += fast_exp2(fmaf(x[k], scale, -base));
  return sum;
}

// How a row's outputs follow from their exponents: y = exp2(x * scale - base) * inv. 16-bit outputs
// fold the 1 / sum into the subtrahend where that keeps its precision, y = exp2(x * scale - (base +
// log2(sum))), one multiply less per element: with |base + log2(sum)| < kMaxFoldedSubtrahend the
// float subtrahend is within 2^-19 of exact, an output error of at most 1.3e-6 (bf16 / fp16 round to
// 2e-3 / 4.9e-4; exp2 itself errs by 2.4e-7). Rows past it (scores beyond ~40 after scaling), with
// nothing kept (sum 0) or NaN multiply.
constexpr float kMaxFoldedSubtrahend = 64.0f;

// log2 on the special-function unit (lg2.approx.ftz, ~2^-22 absolute error), for a row's sum: at
// least 1 (its max's own term), 0 (nothing kept: -inf) or NaN. __log2f adds a rescale for subnormal
// inputs, which a sum never is.
C10_DEVICE C10_ALWAYS_INLINE float sum_log2(float sum) {
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  float out;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(sum));
  return out;
#else
  return __log2f(sum);
#endif
}

struct Normalizer {
  float subtrahend;  // base, or base + log2(sum) where folded
  float inv;         // 1 / sum (0 for a row with nothing kept); unused where folded
  bool folded;

  template <class T>
  static C10_DEVICE C10_ALWAYS_INLINE Normalizer of(float max, float sum) {
    const float base = exp_base(max);
    if constexpr (sizeof(T) == 2) {
      const float subtrahend = base + sum_log2(sum);  // log2(0) = -inf, log2(NaN) = NaN: not folded
      if (fabsf(subtrahend) < kMaxFoldedSubtrahend) return {subtrahend, 1.0f, true};
    }
    return {base, inverse_sum(sum), false};
  }
};

// The vector's outputs: exp2(x * scale - subtrahend), times n.inv unless kFolded.
template <bool kFolded, class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, kVec> probabilities_of(const Packed<T, kVec>& x, float scale,
                                                                     const Normalizer& n) {
  const auto y_of = [&](int k) {
    const float e = fast_exp2(fmaf(x[k], scale, -n.subtrahend));
    return kFolded ? e : e * n.inv;
  };
  AlignedVector<T, kVec> y;
  if constexpr (sizeof(T) == 2 && kVec % 2 == 0) {
    uint32_t words[kVec / 2];
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) words[i] = pack_pair<T>(y_of(2 * i), y_of(2 * i + 1));
    memcpy(&y, words, sizeof(y));
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) y.value[k] = static_cast<T>(y_of(k));
  }
  return y;
}

// Calls write(std::true_type{}) where `folded` (the same in every lane of the warp), else
// write(std::false_type{}): the output loop, compiled once per way.
template <class Write>
C10_DEVICE C10_ALWAYS_INLINE void with_folding(bool folded, Write write) {
  if (folded) {
    write(std::true_type{});
  } else {
    write(std::false_type{});
  }
}

// The (max, sum) statistics over each group of `lanes` neighbouring lanes (every lane of the warp calls
// it and gets its group's): the max first, then each lane's sum (over exp2(v - exp_base(its max)))
// rescaled to it and added up. A lane whose max is -inf has the sum 0 and is rescaled by exp2(-inf) = 0.
// log2(lanes) shuffles of each, where merging whole Stats per shuffle took two exponentials and a branch.
C10_DEVICE C10_ALWAYS_INLINE Stats group_stats(const Stats& mine, int lanes) {
  const float max = cuda::group_reduce(mine.max, lanes, Max{});
  const float sum = cuda::group_reduce(mine.sum * fast_exp2(mine.max - exp_base(max)), lanes, Sum{});
  return {max, sum};
}

// group_stats over the block, every thread getting them, with one barrier: each warp's statistics go
// to scratch[parity], and every warp combines all of them. Consecutive calls alternate `parity`, as
// block_all_reduce_once's do.
C10_DEVICE C10_ALWAYS_INLINE Stats block_stats_once(const Stats& mine, Stats (*scratch)[kMaxRowWarps], int parity) {
  const Stats warp_stats = group_stats(mine, C10_WARP_SIZE);
  const int warps = blockDim.x / C10_WARP_SIZE;
  if (warps == 1) return warp_stats;
  const int lane = threadIdx.x % C10_WARP_SIZE, warp = threadIdx.x / C10_WARP_SIZE;
  if (lane == 0) scratch[parity][warp] = warp_stats;
  __syncthreads();
  return group_stats(lane < warps ? scratch[parity][lane] : Stats::empty(), C10_WARP_SIZE);
}

// The vector's outputs e * factor, as T (16-bit pairs by one cvt).
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, kVec> outputs_of(const float (&e)[kVec], float factor) {
  AlignedVector<T, kVec> y;
  if constexpr (sizeof(T) == 2 && kVec % 2 == 0) {
    uint32_t words[kVec / 2];
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) words[i] = pack_pair<T>(e[2 * i] * factor, e[2 * i + 1] * factor);
    memcpy(&y, words, sizeof(y));
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) y.value[k] = static_cast<T>(e[k] * factor);
  }
  return y;
}

// ---- exponentials kept between the sum and output passes (the row kernel, rows without a causal bound)
//
// exp2(x * scale - base) is wanted twice per element: in the sum pass and in the output pass.
// Kept<T, kVec> holds the sum pass's exponentials, in the registers the loaded vector held: 16-bit
// data as half pairs (one cvt per pair; the output pass unpacks them, multiplies by one factor and
// packs: per element one MUFU.EX2, an FFMA and the launder's PRMT fewer than recomputing them; bf16
// row kernel 112 -> 49 MUFU.EX2 and 2424 -> 2104 SASS instructions, 64 registers, no spills), float
// data as floats. Measured on an H200 (bf16, copy ~4170 GB/s), forward / forward+backward of copy
// bandwidth, recomputing -> keeping: masked 1x4x256x65536 76.4/83.7% -> 83.8/88.5%, 1x8x512x32768
// 86.5/90.5% -> 87.5/91.4%, 16x16x512x512 94.0/98.0% -> 96.7/100.6%.
// A half's 11 bits are exact enough for a 16-bit output only where it is a normal number, so the
// exponentials are taken relative to the thread's own max less kKeepShift: e in [2^-(29), 2^15] keeps
// full precision (fp16's normals start at 2^-14), which leaves out only outputs below 2^-29 of their
// row's largest (absolute errors under 2^-38). The statistics carry the same shift (every thread's max
// less kKeepShift), so merging them needs no change; see keep_factor.
constexpr float kKeepShift = 15.0f;  // 2^15 = 32768 <= 65504, fp16's largest

template <class T, int kVec>
struct Kept {
  static constexpr bool kPairs = sizeof(T) == 2 && kVec % 2 == 0;
  static constexpr int kWords = kPairs ? kVec / 2 : kVec;
  uint32_t w[kWords];
};

// sum + each exp2(x * scale - base) of the vector, kept in e.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE float keep_exps(const Packed<T, kVec>& x, float scale, float base, Kept<T, kVec>& e,
                                             float sum) {
  if constexpr (Kept<T, kVec>::kPairs) {
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      const float low = fast_exp2(fmaf(x[2 * i], scale, -base)), high = fast_exp2(fmaf(x[2 * i + 1], scale, -base));
      sum += low + high;
      e.w[i] = pack_pair<c10::Half>(low, high);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float v = fast_exp2(fmaf(x[k], scale, -base));
      sum += v;
      e.w[k] = __float_as_uint(v);
    }
  }
  return sum;
}

// The two halves of a word as float. By asm on the word: through __half2 the compiler split each kept
// word into two 16-bit registers (twice the registers: the keeping kernels spilled).
C10_DEVICE C10_ALWAYS_INLINE float2 unpack_halves(uint32_t w) {
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  float2 out;
  asm("{ .reg .f16 low, high; mov.b32 {low, high}, %2; cvt.f32.f16 %0, low; cvt.f32.f16 %1, high; }"
      : "=f"(out.x), "=f"(out.y)
      : "r"(w));
  return out;
#else
  return unpack_pair<c10::Half>(w);
#endif
}

// The vector's outputs e * factor, as T.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, kVec> kept_outputs(const Kept<T, kVec>& e, float factor) {
  float v[kVec];
  if constexpr (Kept<T, kVec>::kPairs) {
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      const float2 pair = unpack_halves(e.w[i]);
      v[2 * i] = pair.x, v[2 * i + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = __uint_as_float(e.w[k]);
  }
  return outputs_of<T, kVec>(v, factor);
}

// What a thread multiplies its kept exponentials (taken relative to `shifted` = its own base less
// kKeepShift) by: their share of the row's sum, from the row's statistics (max less kKeepShift, sum
// relative to it). The exponent is at most 0 (a thread's max is at most its row's) but for a thread that
// kept nothing (base 0, exponentials 0), where it could overflow to inf (a row of scores far below 0)
// and 0 * inf would write NaN: clamped to 0. NaN and +inf rows keep their NaN sum (fminf drops the NaN
// exponent of an +inf row, not the sum's).
C10_DEVICE C10_ALWAYS_INLINE float keep_factor(float shifted, const Stats& row) {
  return fast_exp2(fminf(shifted - exp_base(row.max), 0.0f)) * inverse_sum(row.sum);
}

// `group` lanes per row; each lane takes kRows consecutive rows (of the visiting order) at once,
// kPacks vectors of each, all loaded before any is used. With a mask shared by the heads the
// kRows rows are heads of one (b, q) (or of two, where np is not a multiple of kRows): a row whose
// mask row is the previous row's reuses its flags instead of loading them again.
template <class T, int kVec, int kPacks>
__global__ void __launch_bounds__(kWarpKernelThreads, kMinWarpBlocksPerSm) warp_forward(ForwardArgs a, int group) {
  constexpr int kRows = rows_per_lane(kWarpForwardVectors, kPacks);
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const float scale = a.scale * kLog2e;
  if (kPacks > 1) group = C10_WARP_SIZE;  // known here: the shuffles unroll, the columns are immediates
  const bool head_fastest = heads_share_mask(a);
  const WarpRows lanes(group);
  const int member = lanes.member;
  const auto column = [&](int p) { return (p * group + member) * kVec; };
  const int cols = static_cast<int>(a.cols);  // at most kWarpForwardVectors * C10_WARP_SIZE vectors
  const bool has_mask = a.mask != nullptr;
  const int64_t sets = (a.rows + kRows - 1) / kRows;
  // Block by block (see WarpRows): a warp past the last set idles through its block's last iteration.
  for (int64_t block_first = lanes.block_first; block_first < sets; block_first += lanes.step) {
    const int64_t first = block_first + lanes.warp_offset;
    const int64_t set = first + lanes.slot;
    const int64_t t0 = (set < sets ? set : first) * kRows;
    const RowIndex r0 = row_at(a, t0, head_fastest);
    RowIndex r = r0;
    // Vectors at or past a row's kept columns are not loaded: whatever they hold is dropped whole.
    Packed<T, kVec> in[kRows][kPacks];
    MaskBytes<kVec> masked[kRows][kPacks];
    int kept[kRows];  // columns of the row that can take part (inside the causal bound; 0 past the last row)
    bool reuse[kRows];
    const uint8_t* previous = nullptr;
    // Every load of the kRows rows first.
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const bool live = set < sets && t0 + j < a.rows;
      const int64_t offset = row_offset(a, r);
      kept[j] = live ? static_cast<int>(row_kept(a, r)) : 0;
      const uint8_t* mask = a.mask != nullptr ? mask_row(a, r) : nullptr;
      reuse[j] = j > 0 && mask == previous;
      previous = mask;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        const int col = column(p);
        masked[j][p] = MaskBytes<kVec>::zero();
        if (col < kept[j]) in[j][p] = Packed<T, kVec>::load(x, offset + col);
        // Up to cols, not kept: a row reusing these flags may keep more columns.
        if (mask != nullptr && live && !reuse[j] && col < cols) masked[j][p] = MaskBytes<kVec>::load(mask, col);
      }
      if (j + 1 < kRows) next_row(a, r, head_fastest);
    }
    // Dropped elements become -inf; each row's largest scaled element. The warp's vectors p of a row
    // are consecutive columns: the passes skip (warp_any) those all past the causal bound, and a lane's
    // own vector past it (not loaded) is dropped whole.
    Dropped<kVec> mask_flags[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) mask_flags[p] = Dropped<kVec>::from_bits(0);
    float base[kRows], sums[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (has_mask) {  // kernel-uniform: rows without a mask skip the flags' instructions
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
          if (!reuse[j]) mask_flags[p] = Dropped<kVec>::masked(masked[j][p]);
        }
      }
      LoadedMax<T> most;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        const int room = kept[j] - column(p);
        if (warp_any(room > 0)) {
          Dropped<kVec> dropped = mask_flags[p];
          if (warp_any(room < kVec)) {  // the row's causal bound, or its end (short rows), is here
            const Dropped<kVec> past = Dropped<kVec>::from_bits(bits_past<kVec>(room));
#pragma unroll
            for (int i = 0; i < Dropped<kVec>::kWords; ++i) dropped.w[i] |= past.w[i];
          }
          if (warp_any(dropped.any())) drop_elements(in[j][p], dropped);
          most.absorb(in[j][p]);
          if constexpr (LoadedMax<T>::template converts<kVec>()) launder(in[j][p]);
        }
      }
      base[j] = most.value() * scale;
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) base[j] = exp_base(cuda::group_reduce(base[j], group, Max{}));
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      float sum = 0.0f;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        if (warp_any(column(p) < kept[j])) sum = exp_sum(in[j][p], scale, base[j], sum);
      }
      sums[j] = sum;
    }
    Normalizer norm[kRows];
    bool fold = true;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      // base[j] = exp_base(max) is the max wherever that matters (Normalizer takes exp_base again).
      norm[j] = Normalizer::of<T>(base[j], cuda::group_reduce(sums[j], group, Sum{}));
      fold = fold && norm[j].folded;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) launder(in[j][p]);
    }
    // Folded only where every row of the warp is (its lanes may hold different rows): a uniform branch.
    with_folding(!warp_any(!fold), [&](auto folded) {
      RowIndex at = r0;
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const bool live = set < sets && t0 + j < a.rows;
        T* const row_y = y + row_offset(a, at);
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
          const int col = column(p);
          const AlignedVector<T, kVec> out = warp_any(col < kept[j])
                                                 ? probabilities_of<decltype(folded)::value>(in[j][p], scale, norm[j])
                                                 : zeros<T, kVec>();
          store_vector_if(live && col < cols, row_y + col, out);
        }
        if (j + 1 < kRows) next_row(a, at, head_fastest);
      }
    });
  }
}

// One block, or a cluster of plan.cluster blocks (one chunk each), per row, the row in registers
// (kRowForwardVectors vectors per thread); see softmax_cuda.cuh. A block loads its next row before
// it reduces the current one, and loads a mask row only when it differs from the current row's
// (heads of one (b, q) run back to back): the thread keeps the mask as bits in one register.
// A kernel holding the next row in shared memory instead (cp.async.bulk on an mbarrier, 8 vectors a
// thread, 64K bf16 rows in one block) lost at 32K and 64K columns (H200 bf16 masked 1x4x256x65536
// forward 71.3% of copy against this kernel's 83.8%): one row in flight per block behind a barrier.
// kKeep (rows without a causal bound, which run() gives it): the exponentials are kept (Kept) between
// the passes. Causal rows recompute them: they skip the masked triangle and run past copy bandwidth
// already (H200 bf16: causal 64x2048x2048 forward 124.0% of copy, 16x8192x8192 113.3%).
template <class T, int kVec, bool kKeep>
__global__ void __launch_bounds__(kMaxRowThreads, 1) row_forward(ForwardArgs a, Plan plan) {
  constexpr int kVectors = kRowForwardVectors;
  constexpr uint32_t kAll = (1u << kVec) - 1u;
  static_assert(kVectors * kVec <= 32, "a thread's mask bits fit one 32-bit word");
  __shared__ Stats scratch[2][kMaxRowWarps];
  __shared__ ClusterExchange<Stats> cluster_stats;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const float scale = a.scale * kLog2e;
  const bool head_fastest = heads_share_mask(a);
  const int cluster = plan.cluster;
  const int begin = cluster_rank() * static_cast<int>(plan.chunk);
  const int end = static_cast<int>(std::min<int64_t>(begin + plan.chunk, a.cols));
  // The column of this thread's k-th vector (computed where used: an array of them took registers).
  const int col0 = begin + static_cast<int>(threadIdx.x) * kVec, stride = static_cast<int>(blockDim.x) * kVec;
  const auto column = [&](int k) { return col0 + k * stride; };
  const BlockRows rows(a.rows, cluster, a.causal);
  if (cluster > 1) exchange_init(cluster_stats);

  // The next row's loads, issued a row ahead. Vectors at or past a row's limit are not loaded: they
  // keep stale values, which the row drops whole (zeros are written there).
  Packed<T, kVec> next[kVectors];
  MaskBytes<kVec> next_mask[kVectors];
#pragma unroll
  for (int k = 0; k < kVectors; ++k) next[k] = Packed<T, kVec>::zero(), next_mask[k] = MaskBytes<kVec>::zero();
  int64_t next_offset = 0;
  int next_limit = 0;
  const uint8_t* next_mask_row = nullptr;
  const uint8_t* mask_row_now = nullptr;  // the mask row `bits` holds
  uint32_t bits = 0;                      // bit k * kVec + e: element e of vector k is masked
  // Where row t lies. Without a mask the rows go in storage order: row t starts at t * cols, and only
  // causal rows divide (for their query index). With one, a block's consecutive rows (all but causal
  // ones, which no masked op has) step by next_row() from the previous, without dividing.
  RowIndex issued = a.mask != nullptr ? row_at(a, rows.first, head_fastest) : RowIndex{};
  const auto issue = [&](int64_t t) {
    int64_t kept = a.cols;
    if (a.mask == nullptr) {
      next_offset = t * a.cols;
      if (a.causal) {
        int64_t rest, q;
        div_mod(t, a.queries, rest, q);
        kept = std::min<int64_t>(q + 1, a.cols);
      }
      next_mask_row = nullptr;
    } else {
      if (t != rows.first) {
        if (rows.step == 1) {
          next_row(a, issued, head_fastest);
        } else {
          issued = row_at(a, t, head_fastest);
        }
      }
      next_offset = row_offset(a, issued);
      kept = row_kept(a, issued);
      next_mask_row = mask_row(a, issued);
    }
    next_limit = static_cast<int>(std::min<int64_t>(end, kept));
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      if (column(k) < next_limit) next[k] = Packed<T, kVec>::load(x, next_offset + column(k));
    }
    if (next_mask_row != mask_row_now) {
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
        if (column(k) < end) next_mask[k] = MaskBytes<kVec>::load(next_mask_row, column(k));
      }
    }
  };

  int64_t t = rows.first;
  if (t < rows.end) issue(t);
  for (uint32_t n = 0; t < rows.end; t += rows.step, ++n) {
    Packed<T, kVec> in[kVectors];
#pragma unroll
    for (int k = 0; k < kVectors; ++k) in[k] = next[k];
    const int64_t offset = next_offset;
    const int limit = next_limit;
    if (next_mask_row != mask_row_now) {
      bits = 0;
#pragma unroll
      for (int k = 0; k < kVectors; ++k) bits |= next_mask[k].bits() << (k * kVec);
      mask_row_now = next_mask_row;
    }
    if (t + rows.step < rows.end) issue(t + rows.step);
    // Dropped elements become -inf; this thread's largest scaled element, and its exponentials' sum.
    // A warp's k-th vectors are consecutive columns: all of them or none are live but at the causal
    // bound, so the passes skip (warp_any) the vectors past it. A lane's own vector past its limit
    // (not loaded) is dropped whole.
    LoadedMax<T> most;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const int room = limit - column(k);
      // Keeping: every vector is dropped where past the row and takes part in the sum pass (its
      // exponentials 0, not stored): a branch around it left the kept words maybe-unset, which cost
      // ptxas twice their registers (56-76 bytes of spills).
      if (kKeep || warp_any(room > 0)) {
        const uint32_t dropped = ((bits >> (k * kVec)) | bits_past<kVec>(room)) & kAll;
        if (warp_any(dropped != 0)) drop_elements(in[k], Dropped<kVec>::from_bits(dropped));
        most.absorb(in[k]);
        if constexpr (LoadedMax<T>::template converts<kVec>()) launder(in[k]);
      }
    }
    const float own_max = most.value() * scale, own_base = exp_base(own_max);
    if constexpr (kKeep) {
      const float shifted = own_base - kKeepShift;
      // limit = end (no causal bound): vectors past it are dropped whole, 0 in the sum, not stored.
      Kept<T, kVec> e[kVectors];
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kVectors; ++k) sum = keep_exps(in[k], scale, shifted, e[k], sum);
      Stats stats = block_stats_once(Stats{own_max - kKeepShift, sum}, scratch, static_cast<int>(n & 1u));
      if (cluster > 1) stats = exchange(cluster_stats, stats, MergeStats{}, Stats::empty(), cluster, n);
      const float factor = keep_factor(shifted, stats);
      T* const row_y = y + offset + col0;
#pragma unroll
      for (int k = 0; k < kVectors; ++k) store_vector_if(column(k) < end, row_y + k * stride, kept_outputs(e[k], factor));
      continue;
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      if (warp_any(column(k) < limit)) sum = exp_sum(in[k], scale, own_base, sum);
    }
    Stats stats = block_stats_once(Stats{own_max, sum}, scratch, static_cast<int>(n & 1u));
    if (cluster > 1) stats = exchange(cluster_stats, stats, MergeStats{}, Stats::empty(), cluster, n);
    const Normalizer norm = Normalizer::of<T>(stats.max, stats.sum);  // the block's
    T* const row_y = y + offset + col0;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) launder(in[k]);
    // The same in every lane; asked by a vote, which ptxas knows to be uniform.
    with_folding(!warp_any(!norm.folded), [&](auto folded) {
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
        const AlignedVector<T, kVec> out = warp_any(column(k) < limit)
                                               ? probabilities_of<decltype(folded)::value>(in[k], scale, norm)
                                               : zeros<T, kVec>();
        // 32-bit steps from the row's pointer: one IMAD.WIDE per vector.
        store_vector_if(column(k) < end, row_y + k * stride, out);
      }
    });
  }
  if (cluster > 1) exchange_finish();
}

// ---- rows without a causal bound: each exponential computed once -------------------------------
//
// warp_forward computes exp2(x * scale - base) twice per element, in the sum pass and again in
// the output pass (the row stays packed in registers between them). warp_forward_once keeps the sum
// pass's exponentials in float registers (up to 32 a lane) and writes y = e * factor:
// per element one FMUL where the output pass took a conversion, an FFMA and a MUFU.EX2 (half the
// special-function work, and no launder or fold of 1 / sum). Causal rows keep the kernels above
// (they skip the masked triangle and run past copy bandwidth already).

// sum + exp2(x * scale - base) over the vector's elements, each kept in e.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE float exps_of(const Packed<T, kVec>& x, float scale, float base, float (&e)[kVec],
                                           float sum) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    e[k] = fast_exp2(fmaf(x[k], scale, -base));
    sum += e[k];
  }
  return sum;
}

// The warp kernel for rows without a causal bound (warp_forward's shapes: `group` lanes per row, kRows
// rows a lane, every load first), for layouts whose kRows rows of a lane are evenly spaced in memory
// (see warp_once_fits): row j lies j * row_step elements past the lane's first and its mask row
// j * mask_step bytes past (0: the heads of one (b, q) share it, loaded once), where stepping the
// (b, h, q) indices and multiplying them out took ~40 instructions per row. Every row keeps all its
// columns, so nothing is checked per vector: a lane's vectors past the row's end (short rows) are
// dropped through flags fixed for the kernel, folded into the mask's; loads take no condition (a row
// past the last reloads the lane's first; a lane past the last set reloads the last set's rows; a
// vector past the end reloads the row's first: all inside the tensors, which a simulation of every
// block, warp and lane of the launch checked over many shapes, and compute-sanitizer on the GPU).
// The max is reduced across the group before the exponentials, which are kept for the output
// (y = e / sum) where a row has at most 32 elements a lane.
template <class T, int kVec, int kPacks>
__global__ void __launch_bounds__(kWarpKernelThreads, kMinWarpBlocksPerSm) warp_forward_once(ForwardArgs a, int group) {
  constexpr int kRows = rows_per_lane(kWarpForwardVectors, kPacks);
  constexpr uint32_t kAll = (1u << kVec) - 1u;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const float scale = a.scale * kLog2e;
  if (kPacks > 1) group = C10_WARP_SIZE;  // known here: the shuffles unroll, the columns are immediates
  const bool head_fastest = heads_share_mask(a);
  const WarpRows lanes(group);
  const int member = lanes.member;
  const auto column = [&](int p) { return (p * group + member) * kVec; };
  const int cols = static_cast<int>(a.cols);  // at most kWarpForwardVectors * C10_WARP_SIZE vectors
  const bool has_mask = a.mask != nullptr;
  // This lane's vectors past the row's end (loaded from column 0, dropped whole).
  Dropped<kVec> past[kPacks];
  int load_column[kPacks];
  bool any_past = false;
#pragma unroll
  for (int p = 0; p < kPacks; ++p) {
    const bool out = column(p) >= cols;
    past[p] = Dropped<kVec>::from_bits(out ? kAll : 0u);
    load_column[p] = out ? 0 : column(p);
    any_past = any_past || out;
  }
  // Kernel-uniform: rows without a mask whose warp has no vector past the end drop nothing.
  const bool drop = has_mask || warp_any(any_past);
  const int64_t row_step = head_fastest ? a.queries * a.cols : a.cols;
  const int64_t mask_step = head_fastest ? 0 : a.mask_query_stride;
  const bool shared_mask = head_fastest;  // every row of a lane uses its first row's mask row
  const int64_t sets = (a.rows + kRows - 1) / kRows;
  for (int64_t block_first = lanes.block_first; block_first < sets; block_first += lanes.step) {
    const int64_t first = block_first + lanes.warp_offset;
    const int64_t set = first + lanes.slot;
    // A lane past the last set loads the last set's rows (and stores nothing): not `first`, which
    // for a warp wholly past the last set (its block's last iteration) is past it too, so row_at()
    // would step past the tensors (head-fastest: a head stride per head past the end).
    const int64_t t0 = (set < sets ? set : sets - 1) * kRows;  // < rows: block_first < sets, so sets >= 1
    const RowIndex r0 = row_at(a, t0, head_fastest);
    const int64_t offset0 = row_offset(a, r0);
    const uint8_t* const mask0 = has_mask ? mask_row(a, r0) : nullptr;
    // Rows past the last (live false) reload row t0 and store nothing.
    const int left = set < sets ? static_cast<int>(std::min<int64_t>(a.rows - t0, kRows)) : 0;
    Packed<T, kVec> in[kRows][kPacks];
    MaskBytes<kVec> masked[kRows][kPacks];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int step = j < left ? j : 0;
      const int64_t offset = offset0 + step * row_step;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) in[j][p] = Packed<T, kVec>::load(x, offset + load_column[p]);
      if (has_mask && (j == 0 || !shared_mask)) {
        const uint8_t* const mask = mask0 + step * mask_step;
#pragma unroll
        for (int p = 0; p < kPacks; ++p) masked[j][p] = MaskBytes<kVec>::load(mask, load_column[p]);
      }
    }
    // Dropped elements become -inf; each row's largest scaled element, then the group's.
    Dropped<kVec> flags[kPacks];
#pragma unroll
    for (int p = 0; p < kPacks; ++p) flags[p] = past[p];
    float base[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (has_mask && (j == 0 || !shared_mask)) {
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
          flags[p] = Dropped<kVec>::masked(masked[j][p]);
#pragma unroll
          for (int i = 0; i < Dropped<kVec>::kWords; ++i) flags[p].w[i] |= past[p].w[i];
        }
      }
      LoadedMax<T> most;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        if (drop) drop_elements(in[j][p], flags[p]);
        most.absorb(in[j][p]);
        if constexpr (LoadedMax<T>::template converts<kVec>()) launder(in[j][p]);
      }
      base[j] = most.value() * scale;
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) base[j] = exp_base(cuda::group_reduce(base[j], group, Max{}));
    // Row by row: the exponentials, kept; their sum over the group; the outputs (one row's
    // exponentials live at a time: all of them took past 96 registers and spilled). Rows of more
    // than 32 elements a lane (one 16-bit row of 8 vectors) recompute them instead: 64 kept spilled.
    constexpr bool kKeep = kPacks * kVec <= 32;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      float e[kKeep ? kPacks : 1][kVec];
      float sum = 0.0f;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) sum = exps_of(in[j][p], scale, base[j], e[kKeep ? p : 0], sum);
      const float inv = inverse_sum(cuda::group_reduce(sum, group, Sum{}));
      if constexpr (!kKeep) {
#pragma unroll
        for (int p = 0; p < kPacks; ++p) launder(in[j][p]);
      }
      T* const row_y = y + offset0 + j * row_step;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        if constexpr (!kKeep) exps_of(in[j][p], scale, base[j], e[0], 0.0f);
        store_vector_if(j < left && column(p) < cols, row_y + column(p), outputs_of<T, kVec>(e[kKeep ? p : 0], inv));
      }
    }
  }
}

// Whether warp_forward_once takes the call's rows, for its instance of `packs` vectors a lane: no
// causal bound, and each lane's rows evenly spaced (warp_forward_once): storage order without a mask
// always; heads sharing a mask row (visited head-fastest) where np is a multiple of the rows a lane
// takes; storage order with a mask where sq is. The rest keeps warp_forward.
inline bool warp_once_fits(const ForwardArgs& a, int packs) {
  if (a.causal) return false;
  const int rows = rows_per_lane(kWarpForwardVectors, packs);
  const bool head_fastest = a.mask != nullptr && a.mask_head_stride == 0 && a.heads > 1;
  if (head_fastest) return a.heads % rows == 0;
  return a.mask == nullptr || a.queries % rows == 0;
}

// One block (or a cluster of plan.cluster blocks, one chunk each) per row; see softmax_cuda.cuh.
template <class T, int kVec>
__global__ void __launch_bounds__(kMaxBlockThreads, kMinBlocksPerSm) block_forward(ForwardArgs a, Plan plan) {
  extern __shared__ float4 dynamic_smem[];  // float4: 16-byte aligned
  T* staged = reinterpret_cast<T*>(dynamic_smem);
  uint8_t* staged_bits = reinterpret_cast<uint8_t*>(staged + plan.chunk);  // one byte per vector
  __shared__ Stats scratch[kMaxBlockThreads / C10_WARP_SIZE];
  __shared__ Stats block_total;
  __shared__ Stats cluster_slot;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const float scale = a.scale * kLog2e;
  const int64_t begin = static_cast<int64_t>(cluster_rank()) * plan.chunk;
  const int64_t end = std::min<int64_t>(begin + plan.chunk, a.cols);
  const int64_t step = static_cast<int64_t>(blockDim.x) * kVec;
  const int64_t first_col = begin + static_cast<int64_t>(threadIdx.x) * kVec;
  // Every block of a cluster handles the same rows, so all reach the same cluster barriers.
  for (int64_t i = blockIdx.x / plan.cluster; i < a.rows; i += gridDim.x / plan.cluster) {
    const RowRef row = locate(a, i);
    const int64_t kept_end = std::min(end, row.kept);
    Stats stats = Stats::empty();
    // Pass 1: the statistics of this chunk, staging what each thread loads (its own slots only,
    // which it alone reads in pass 2: no barrier needed around the staging).
    for (int64_t col0 = first_col; col0 < kept_end; col0 += kForwardUnroll * step) {
      AlignedVector<T, kVec> in[kForwardUnroll];
#pragma unroll
      for (int u = 0; u < kForwardUnroll; ++u) {
        if (col0 + u * step < kept_end) in[u] = load_vector<kVec>(x, row.offset + col0 + u * step);
      }
#pragma unroll
      for (int u = 0; u < kForwardUnroll; ++u) {
        const int64_t col = col0 + u * step;
        if (col < kept_end) {
          const uint32_t bits = kept_bits<kVec>(row, col);
          float v[kVec];
          stats.absorb<kVec>(v, scaled<T, kVec>(in[u], bits, scale, v));
          if (plan.staged) {
            store_vector<kVec>(staged, col - begin, in[u]);
            staged_bits[(col - begin) / kVec] = static_cast<uint8_t>(bits);
          }
        }
      }
    }
    stats = cuda::block_all_reduce(stats, MergeStats{}, Stats::empty(), scratch, &block_total);
    stats = cluster_all_reduce(stats, MergeStats{}, Stats::empty(), plan.cluster, &cluster_slot);
    // Pass 2: the chunk's probabilities; zeros past the causal bound, never read.
#pragma unroll 4
    for (int64_t col = first_col; col < end; col += step) {
      AlignedVector<T, kVec> out = zeros<T, kVec>();
      if (col < kept_end) {
        if (plan.staged) {
          out = probabilities<T, kVec>(load_vector<kVec>(staged, col - begin), staged_bits[(col - begin) / kVec],
                                       scale, stats);
        } else {
          out = probabilities<T, kVec>(load_vector<kVec>(x, row.offset + col), kept_bits<kVec>(row, col), scale, stats);
        }
      }
      store_vector<kVec>(y, row.offset + col, out);
    }
  }
}

template <class T, int kVec>
void run(const ForwardArgs& args, const Cuda& device) {
  static_assert(kWarpForwardVectors == 8, "one warp kernel instance per power of two up to kWarpForwardVectors");
  void (*const warp_kernels[])(ForwardArgs, int) = {warp_forward<T, kVec, 1>, warp_forward<T, kVec, 2>,
                                                     warp_forward<T, kVec, 4>, warp_forward<T, kVec, 8>};
  // The row kernel takes vector data only; scalar rows past the warp kernel take the block kernel.
  // Rows without a causal bound keep their exponentials between the passes (Kept).
  void (*row_kernel)(ForwardArgs, Plan) = nullptr;
  if constexpr (kVec > 1) row_kernel = args.causal ? row_forward<T, kVec, false> : row_forward<T, kVec, true>;
  // Staged (block kernel): the chunk's elements and one byte of keep bits per vector.
  const double stage_bytes_per_column = sizeof(T) + 1.0 / kVec;
  // The warp and row kernels take positive finite scales (in the exp2 domain, as they compute it):
  // they overwrite dropped elements with -inf, which only such a scale keeps at -inf. Any other scale
  // (0, negative, NaN, overflowing) takes the block kernel, which selects per element; no model uses one.
  const float exp2_scale = args.scale * kLog2e;
  if (!(exp2_scale > 0.0f && exp2_scale < INFINITY)) {
    Plan plan{};
    plan.vec = kVec;
    plan_block(plan, args.cols, stage_bytes_per_column, device, supports_clusters(block_forward<T, kVec>, device));
    launch_block_kernel(block_forward<T, kVec>, plan, args, device, "fused_softmax forward");
    return;
  }
  // Rows without a causal bound that warp_forward_once takes (short rows, lanes' rows evenly spaced:
  // warp_once_fits); the rest as before.
  if (!args.causal) {
    const int64_t vectors = ceil_div(args.cols, kVec);
    if (vectors <= int64_t{C10_WARP_SIZE} * kWarpForwardVectors) {
      Plan plan{};
      plan.vec = kVec;
      plan_warp(plan, vectors);
      if (warp_once_fits(args, plan.packs)) {
        void (*const once_kernels[])(ForwardArgs, int) = {warp_forward_once<T, kVec, 1>, warp_forward_once<T, kVec, 2>,
                                                           warp_forward_once<T, kVec, 4>, warp_forward_once<T, kVec, 8>};
        launch_warp_kernel(once_kernels, plan, args, device, "fused_softmax forward");
        return;
      }
    }
  }
  run_rows(args, device, kVec, kRowForwardVectors, stage_bytes_per_column, row_kernel, block_forward<T, kVec>,
           warp_kernels, "fused_softmax forward");
}

}  // namespace

template <class T>
void forward_as(const Cuda& device, const ForwardArgs& args) {
  constexpr int kVec = vector_width<T>();
  // The mask is read kVec bytes at a time: its rows must start kVec-aligned too.
  const bool mask_aligned = args.mask == nullptr ||
                            (is_aligned(args.mask, kVec) && args.mask_batch_stride % kVec == 0 &&
                             args.mask_head_stride % kVec == 0 && args.mask_query_stride % kVec == 0);
  if (mask_aligned && vector_path<T>(args.cols, {args.x, args.y})) {
    run<T, kVec>(args, device);
  } else {
    run<T, 1>(args, device);
  }
}

// Each instantiated by its own unit only (softmax_forward_<dtype>.cu), not by forward()'s calls.
extern template void forward_as<float>(const Cuda& device, const ForwardArgs& args);
extern template void forward_as<c10::Half>(const Cuda& device, const ForwardArgs& args);
extern template void forward_as<c10::BFloat16>(const Cuda& device, const ForwardArgs& args);

}  // namespace apex::fused_softmax
