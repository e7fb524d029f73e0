#pragma once
// xentropy kernels for bfloat16 / float16 logits, written to the H200's instruction budget. At copy
// speed an H200 SM reads ~8 bf16 logits a clock and issues at most 128 thread-instructions a clock:
// ~16 per element for the read-once forward, ~32 for the backward (it also writes). The generic block
// kernels of xentropy_cuda.cu (apex/row_softmax.cuh, still used for float32 / float64) issue ~15 and
// ~14 per 16-bit element (SASS of their unrolled loops): exp2f's range check (a compare and two
// predicated multiplies around MUFU.EX2), a float max per element, 64-bit address arithmetic per
// load. Here, per element (~5.8 forward, ~5.4 backward):
//   forward:  one unpack, one FFMA (log2(e) folded in), ex2.approx, two FADDs (sum of exps, sum of
//             logits), half a packed 16-bit max;
//   backward: one unpack, one FFMA, ex2.approx, one FFMA (g * p - uniform), half a packed convert.
// ex2.approx.ftz is within ~2 ulp of float (apex/fast_exp2.cuh), far under the logits' 16-bit
// rounding; float32 and float64 logits keep the generic kernels and exp2f / exp2.
//
// Measured on an H200 (bench_xentropy.py --impls apex, bf16, smoothing 0.1, copy ~4190 GB/s), fwd /
// fwd+bwd as % of copy bandwidth, generic kernels -> these (over 100%: the forward only reads, and a
// read-only stream outruns the copy the percentage is measured against):
//   8192x128256   82.9 / 88.9  ->  104.3 / 95.9
//   16384x32000   71.6 / 85.9  ->   98.9 / 96.1
//   4096x256000   81.5 / 88.0  ->  103.6 / 95.1
// A forward with a warp per row (no barrier, no block merge, the next row's label loaded early) was
// measured beside it when rows fill the device: +0.4 to +0.9 points fwd+bwd but -1.4 to -2.6 fwd, so
// one forward shape serves every row count.
//
// A row is read by a block's threads in 16-byte packs of 8 logits: pack p by the thread of rank
// p % lanes, the packs of a thread in batches of kUnroll loaded before any is used. The row's
// misaligned head and tail (< 8 logits each) are read as scalars.
// Device code; xentropy_cuda.cu includes it after apex/cuda.cuh and apex/row_softmax.cuh.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "apex/fast_exp2.cuh"
#include "apex/packed_pairs.cuh"
#include "xentropy.h"
#include "xentropy_math.h"

namespace apex::xentropy::bits16 {

using cuda::kLog2e;
using cuda::kNegInf;

constexpr int kPackElements = 8;  // 16-bit logits in a 16-byte pack
constexpr int kPackWords = 4;     // 32-bit words (two logits each) in a pack

// The larger of each half of two words of 16-bit T, NaN halves ignored (as fmaxf): one instruction
// for two logits.
template <class T>
C10_DEVICE C10_ALWAYS_INLINE uint32_t max_pairs(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(USE_ROCM)
  uint32_t out;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    asm("max.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  } else {
    asm("max.f16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  }
  return out;
#else
  const float2 x = unpack_pair<T>(a), y = unpack_pair<T>(b);
  return pack_pair<T>(fmaxf(x.x, y.x), fmaxf(x.y, y.y));  // exact: both are values of T
#endif
}

// A pack whose every logit is -inf: pads a batch past the row's last pack (adds nothing to the
// max or to the sum of exps; the sum of logits skips it).
template <class T>
constexpr uint32_t kNegInfPair = std::is_same_v<T, c10::BFloat16> ? 0xff80ff80u : 0xfc00fc00u;

// exp2 argument offset for a running max m: x * log2e - base is the exponent of exp(x - m). 0 while
// m is -inf, so that -inf logits (and the rescale of an empty sum) give 2^-inf = 0, never NaN.
C10_DEVICE C10_ALWAYS_INLINE float exp2_base(float m) { return m == kNegInf<float> ? 0.0f : m * kLog2e<float>; }

// Online softmax statistics of what a thread (then its group) has read of a row. Plain data (it
// also lives in shared memory): start from empty().
struct Stats {
  float max;      // largest logit (-inf: none yet)
  float sum_exp;  // sum of exp(x - max)
  float sum;      // sum of the logits (label smoothing's mean)

  static C10_DEVICE C10_ALWAYS_INLINE Stats empty() { return {kNegInf<float>, 0.0f, 0.0f}; }

  // Raises the max to at least m and returns the new exp2 base. The rescale is paid on every call
  // (one FFMA, one MUFU, one FMUL for a batch of kUnroll x 8 logits) rather than branched around.
  C10_DEVICE C10_ALWAYS_INLINE float raise(float m) {
    const float raised = fmaxf(max, m);
    const float base = exp2_base(raised);
    sum_exp *= fast_exp2(fmaf(max, kLog2e<float>, -base));
    max = raised;
    return base;
  }
  C10_DEVICE C10_ALWAYS_INLINE void add(float x, float base) {
    sum_exp += fast_exp2(fmaf(x, kLog2e<float>, -base));
    sum += x;
  }
};

// Absorbs a batch of packs into `stats`; packs from `count` on are padding (-inf), left out of the
// sum of logits (kPartial: the row's last batch; a full batch has count == kUnroll).
template <class T, int kUnroll, bool kPartial>
C10_DEVICE C10_ALWAYS_INLINE void absorb(Stats& stats, const uint4 (&packs)[kUnroll], int count) {
  uint32_t top = packs[0].x;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint32_t w[kPackWords] = {packs[u].x, packs[u].y, packs[u].z, packs[u].w};
#pragma unroll
    for (int k = u == 0 ? 1 : 0; k < kPackWords; ++k) top = max_pairs<T>(top, w[k]);
  }
  const float2 top_pair = unpack_pair<T>(top);
  const float base = stats.raise(fmaxf(top_pair.x, top_pair.y));
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint32_t w[kPackWords] = {packs[u].x, packs[u].y, packs[u].z, packs[u].w};
#pragma unroll
    for (int k = 0; k < kPackWords; ++k) {
      const float2 x = unpack_pair<T>(w[k]);
      stats.sum_exp += fast_exp2(fmaf(x.x, kLog2e<float>, -base)) + fast_exp2(fmaf(x.y, kLog2e<float>, -base));
      if (!kPartial || u < count) stats.sum += x.x + x.y;
    }
  }
}

C10_DEVICE C10_ALWAYS_INLINE uint4 load_pack(const uint4* p) { return *p; }

// The row x[0, length) as this thread (rank of `lanes`) sees it, folded into `stats`.
template <class T, int kUnroll>
C10_DEVICE C10_ALWAYS_INLINE void read_row(Stats& stats, const T* x, int64_t length, int rank, int lanes) {
  const cuda::RowSplit split = cuda::split_row<T, kPackElements>(x, length);
  const auto scalar = [&](int64_t j) {
    const float v = static_cast<float>(x[j]);
    stats.add(v, stats.raise(v));
  };
  if (rank < split.head) scalar(rank);
  if (split.tail() + rank < length) scalar(split.tail() + rank);
  const uint4* body = reinterpret_cast<const uint4*>(x + split.head);
  const int64_t packs = split.packs;
  const int64_t batch = static_cast<int64_t>(kUnroll) * lanes;
  int64_t p = rank;
  for (; p + batch - lanes < packs; p += batch) {  // whole batches: every load in range
    uint4 loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) loaded[u] = load_pack(body + p + static_cast<int64_t>(u) * lanes);
    absorb<T, kUnroll, false>(stats, loaded, kUnroll);
  }
  if (p < packs) {  // the last, partial batch
    uint4 loaded[kUnroll];
    int count = 0;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t q = p + static_cast<int64_t>(u) * lanes;
      if (q < packs) {
        loaded[u] = load_pack(body + q);
        count = u + 1;
      } else {
        loaded[u] = make_uint4(kNegInfPair<T>, kNegInfPair<T>, kNegInfPair<T>, kNegInfPair<T>);
      }
    }
    absorb<T, kUnroll, true>(stats, loaded, count);
  }
}

// The statistics of a warp's threads merged (every lane gets them): the max first, then each
// lane's sums rescaled to it once and added, rather than a rescale per shuffle step.
C10_DEVICE C10_ALWAYS_INLINE Stats warp_merge(Stats mine) {
  Stats all = Stats::empty();
  all.max = cuda::warp_reduce(mine.max, [](float a, float b) { return fmaxf(a, b); });
  const float base = exp2_base(all.max);
  const float2 sums = cuda::warp_reduce(
      make_float2(mine.sum_exp * fast_exp2(fmaf(mine.max, kLog2e<float>, -base)), mine.sum),
      [](float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); });
  all.sum_exp = sums.x;
  all.sum = sums.y;
  return all;
}

// Per-row outputs, written by one thread.
C10_DEVICE C10_ALWAYS_INLINE void write_row(const ForwardArgs& args, int64_t row, Label kind, float label_logit,
                                            const Stats& stats) {
  const float lse = stats.max + logf(stats.sum_exp);
  static_cast<float*>(args.max_log_sum_exp)[row] = lse;
  static_cast<float*>(args.losses)[row] =
      kind == Label::kValid ? row_loss(lse, label_logit, stats.sum, args.logits.classes, args.smoothing)
                            : quiet_nan<float>();
}

// The label's logit, loaded when the row starts (its latency hidden behind the row's) by the one
// thread that writes the loss.
template <class T>
C10_DEVICE C10_ALWAYS_INLINE float label_logit_of(const T* x, int64_t label, Label kind, bool writer) {
  return writer && kind == Label::kValid ? static_cast<float>(x[label]) : 0.0f;
}

// --- forward --------------------------------------------------------------------------------
// The block shape of xentropy_cuda.cu (64..256 threads by row length, a block per row) with the loop
// above, 8 packs (128 bytes) a thread in flight. Warps merge by shuffles, then through shared memory
// with one barrier a row: the scratch alternates between two halves by row, so a row's writes never
// meet the previous row's reads.
constexpr int kMaxThreads = 256;
constexpr int kMinThreads = 64;
constexpr int kMinBlocksPerSm = 4;  // registers <= 64
constexpr int kForwardUnroll = 8;

template <class T>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocksPerSm) forward_kernel(ForwardArgs args) {
  constexpr int kMaxWarps = kMaxThreads / 32;
  __shared__ Stats scratch[2][kMaxWarps];
  const T* logits = static_cast<const T*>(args.logits.data);
  const int64_t classes = args.logits.classes;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < args.logits.rows; row += gridDim.x) {
    const int64_t label = args.labels[row];
    const Label kind = classify(label, args.ignore_index, classes);
    if (kind == Label::kIgnored) {  // block-uniform: the row is never read
      if (threadIdx.x == 0) {
        static_cast<float*>(args.losses)[row] = 0.0f;
        static_cast<float*>(args.max_log_sum_exp)[row] = 0.0f;
      }
      continue;
    }
    const T* x = logits + row * args.logits.row_stride;
    const float label_logit = label_logit_of(x, label, kind, threadIdx.x == 0);
    Stats stats = Stats::empty();
    read_row<T, kForwardUnroll>(stats, x, classes, threadIdx.x, blockDim.x);
    stats = warp_merge(stats);
    if (threadIdx.x % 32 == 0) scratch[parity][warp] = stats;
    __syncthreads();
    if (threadIdx.x == 0) {
      Stats all = scratch[parity][0];
      for (int w = 1; w < warps; ++w) {
        const Stats other = scratch[parity][w];
        const float base = all.raise(other.max);
        all.sum_exp += other.sum_exp * fast_exp2(fmaf(other.max, kLog2e<float>, -base));
        all.sum += other.sum;
      }
      write_row(args, row, kind, label_logit, all);
    }
    parity ^= 1;
  }
}

// --- backward -------------------------------------------------------------------------------
// out = g * exp(x - lse) - uniform for the whole row; the label's element is rewritten afterwards by
// the thread that wrote it (split.owner(label): program order, no barrier).
constexpr int kBackwardUnroll = 4;

template <class T>
C10_DEVICE C10_ALWAYS_INLINE uint4 scaled_softmax_pack(uint4 in, float base, float scale, float minus) {
  const uint32_t w[kPackWords] = {in.x, in.y, in.z, in.w};
  uint32_t out[kPackWords];
#pragma unroll
  for (int k = 0; k < kPackWords; ++k) {
    const float2 x = unpack_pair<T>(w[k]);
    out[k] = pack_pair<T>(fmaf(scale, fast_exp2(fmaf(x.x, kLog2e<float>, -base)), -minus),
                          fmaf(scale, fast_exp2(fmaf(x.y, kLog2e<float>, -base)), -minus));
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

template <class T>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocksPerSm) backward_kernel(BackwardArgs args) {
  const T* logits = static_cast<const T*>(args.logits.data);
  const int64_t classes = args.logits.classes;
  const float* grad_loss = static_cast<const float*>(args.grad_loss);
  const float* lses = static_cast<const float*>(args.max_log_sum_exp);
  T* grad_logits = static_cast<T*>(args.grad_logits);
  const int rank = threadIdx.x, lanes = blockDim.x;
  for (int64_t row = blockIdx.x; row < args.logits.rows; row += gridDim.x) {
    const int64_t label = args.labels[row];
    const Label kind = classify(label, args.ignore_index, classes);
    const T* x = logits + row * args.logits.row_stride;
    T* out = grad_logits + row * classes;  // the host made x and out equally aligned
    if (kind == Label::kIgnored) {         // block-uniform: zeros, the row is never read
      cuda::zero_row<kPackElements>(out, classes);
      continue;
    }
    const float g = kind == Label::kValid ? grad_loss[row * args.grad_stride] : quiet_nan<float>();
    const GradTerms<float> terms = grad_terms(g, classes, args.smoothing);
    const float lse = lses[row];
    const float base = lse * kLog2e<float>;
    const cuda::RowSplit split = cuda::split_row<T, kPackElements>(x, classes);
    const auto scalar = [&](int64_t j) {
      out[j] = static_cast<T>(fmaf(g, fast_exp2(fmaf(static_cast<float>(x[j]), kLog2e<float>, -base)), -terms.uniform));
    };
    if (rank < split.head) scalar(rank);
    if (split.tail() + rank < classes) scalar(split.tail() + rank);
    const uint4* in = reinterpret_cast<const uint4*>(x + split.head);
    uint4* body = reinterpret_cast<uint4*>(out + split.head);
    const int64_t packs = split.packs;
    const int64_t batch = static_cast<int64_t>(kBackwardUnroll) * lanes;
    int64_t p = rank;
    for (; p + batch - lanes < packs; p += batch) {  // whole batches
      uint4 loaded[kBackwardUnroll];
#pragma unroll
      for (int u = 0; u < kBackwardUnroll; ++u) loaded[u] = load_pack(in + p + static_cast<int64_t>(u) * lanes);
#pragma unroll
      for (int u = 0; u < kBackwardUnroll; ++u) {
        store_global_16(body + p + static_cast<int64_t>(u) * lanes,
                   scaled_softmax_pack<T>(loaded[u], base, g, terms.uniform));
      }
    }
    if (p < packs) {  // the last, partial batch: its loads still issued together
      uint4 loaded[kBackwardUnroll];
#pragma unroll
      for (int u = 0; u < kBackwardUnroll; ++u) {
        if (p + u * lanes < packs) loaded[u] = load_pack(in + p + static_cast<int64_t>(u) * lanes);
      }
#pragma unroll
      for (int u = 0; u < kBackwardUnroll; ++u) {
        if (p + u * lanes < packs) {
          store_global_16(body + p + static_cast<int64_t>(u) * lanes,
                     scaled_softmax_pack<T>(loaded[u], base, g, terms.uniform));
        }
      }
    }
    if (kind == Label::kValid && rank == split.owner(label)) {
      const float p_label = fast_exp2(fmaf(static_cast<float>(x[label]), kLog2e<float>, -base));
      out[label] = static_cast<T>(g * p_label - terms.uniform - terms.target);
    }
  }
}

}  // namespace apex::xentropy::bits16
