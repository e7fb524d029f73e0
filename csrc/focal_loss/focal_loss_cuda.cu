// focal_loss: CUDA kernels, two families. Which cases take which (kHasRowsKernels, rows_apply()):
// - the rows kernels (rows_forward_kernel, rows_backward_kernel): gamma 2, 16-bit or float logits
//   in 16-byte packs (rows 16-byte aligned), rows of 1 to 256 packs. The common case (RetinaNet-like
//   heads: 96 classes); see "The rows kernels" below for why they are built as they are. bf16 with
//   smoothing in [0, 1] takes rows_backward_half2_kernel instead (its bracket in packed f16x2).
// - the general kernels (forward_kernel, backward_kernel): everything else: other gammas, double,
//   rows that are not 16-byte aligned (one element a "pack"), rows of more than 256 packs.
//
// General kernels. A block is a 2-D tile of rows x packs (a pack: the 16-byte vector of
// classes one load brings) with exactly one thread per pack along a row, not a power of two, so
// that no lane idles: the backward's 96 bf16 classes are 12 packs x 16 rows, 192 threads. The
// forward's tile keeps the packs that hold only real classes (11 of 96 bf16 classes with 91 real:
// 11 x 32 rows) apart from each row's last pack, which also holds padding (32 more threads): only
// those warps mask classes. Each thread works on kRowsInFlight rows at a time and reads its next
// rows while it computes. The forward reads the logits once and writes one partial sum per block,
// which a one-block kernel adds up in a fixed order (the same loss every run); the backward reads
// the logits once more and writes the gradient.
//
// The math is the special-function unit's (focal_loss_math.h): per element one ex2 and one lg2,
// and a quarter of a reciprocal (reciprocals() below), with ~17 more instructions (the forward's
// unmasked packs; PTX) where it took ~200 with expf / log1pf / powf (still issue-bound rather
// than memory-bound at 96 classes: see the rows kernels). The positive class is a sign flip of the same formula.
#include <cstring>
#include <type_traits>

#include "apex/acc_type.h"
#include "apex/block_reduce.cuh"
#include "apex/cuda.cuh"
#include "apex/occupancy.cuh"
#include "focal_loss.h"
#include "focal_loss_math.h"

namespace apex::focal_loss {
namespace {

constexpr int kMaxThreads = 256;         // the backward's block; the forward's rows x packs part
constexpr int kMaxForwardThreads = 512;  // with one more thread per row for its padded last pack
constexpr int kWarp = cuda::kPlanWarp;
constexpr int kRowsInFlight = 2;   // rows a thread computes at a time, the next ones' loads in flight

template <class Acc>
struct Coefficients {
  Acc alpha, gamma, u;  // u = smoothing / 2
};

template <class Acc>
C10_HOST_DEVICE Coefficients<Acc> coefficients_of(const Problem& p) {
  return {static_cast<Acc>(p.alpha), static_cast<Acc>(p.gamma), static_cast<Acc>(p.smoothing / 2)};
}

// The classes [first, first + kVec) of one row, first < real_classes.
struct PackClasses {
  int real;      // how many of them count (below real_classes); kVec for a full pack
  int positive;  // the row's positive class, as an index into the pack, or -1
};

template <int kVec>
C10_DEVICE C10_ALWAYS_INLINE PackClasses pack_classes(int64_t label, int64_t first, int64_t real_classes) {
  const int real = static_cast<int>(std::min<int64_t>(real_classes - first, kVec));
  const int64_t at = label - first;  // background (-1) and padding labels land outside [0, real)
  return {real, at >= 0 && at < real ? static_cast<int>(at) : -1};
}

// r[k] = 1 / d[k] for d[k] in [1, 2] (or NaN, for a NaN logit). In float, four share one
// approximate reciprocal (1 / abcd times the other three factors): the special-function unit also
// computes the exp and the log of every element and bounds the forward kernel, and the 9
// multiplies per 4 values run on the FMA pipe instead. A product of four stays in [1, 16]; the
// error is ~4 ulp. A NaN d spoils the other three; kIsolate takes min(d, 2) instead, keeping
// them apart (the NaN element's own terms are NaN through its e anyway): where a pack holds
// padding, which may be anything, and in the backward, whose elements are separate outputs.
template <bool kIsolate, int kVec, class Acc>
C10_DEVICE C10_ALWAYS_INLINE void reciprocals(const Acc (&d)[kVec], Acc (&r)[kVec]) {
  int k = 0;
  if constexpr (std::is_same_v<Acc, float>) {
#pragma unroll
    for (; k + 4 <= kVec; k += 4) {
      Acc f[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) f[j] = kIsolate ? fminf(d[k + j], 2.0f) : d[k + j];
      const Acc ab = f[0] * f[1], cd = f[2] * f[3];
      const Acc inverse = reciprocal(ab * cd);
      const Acc inverse_ab = inverse * cd, inverse_cd = inverse * ab;
      r[k] = inverse_ab * f[1];
      r[k + 1] = inverse_ab * f[0];
      r[k + 2] = inverse_cd * f[3];
      r[k + 3] = inverse_cd * f[2];
    }
  }
#pragma unroll
  for (; k < kVec; ++k) r[k] = reciprocal(d[k]);
}

// The Softplus terms of a pack's logits x.
template <bool kIsolate, int kVec, class Acc>
C10_DEVICE C10_ALWAYS_INLINE void softplus_values(const Acc (&x)[kVec], Softplus<Acc> (&s)[kVec]) {
  Acc d[kVec], r[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    s[k].e = exp_neg_abs(x[k]);
    d[k] = Acc(1) + s[k].e;
    s[k].log1p_e = log1p_of(s[k].e, d[k]);
  }
  reciprocals<kIsolate>(d, r);
#pragma unroll
  for (int k = 0; k < kVec; ++k) s[k].r = r[k];
}

// The pack's logits in Acc and their Softplus terms.
template <bool kIsolate, int kVec, class T, class Acc>
C10_DEVICE C10_ALWAYS_INLINE void softplus_pack(const AlignedVector<T, kVec>& v, Acc (&x)[kVec],
                                                Softplus<Acc> (&s)[kVec]) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) x[k] = static_cast<Acc>(v.value[k]);
  softplus_values<kIsolate>(x, s);
}

// Adds the m * BCE of the pack's counted classes to `all`, and the positive class's also to `pos`
// (the weighted sum (1 - alpha) * (all - pos) + alpha * pos is taken once per thread). kPadded:
// the pack may hold padding classes (c.real < kVec), left out by a select, not a product, as
// their logits may be anything; else every class counts.
template <int kGamma, bool kPadded, int kVec, class T, class Acc>
C10_DEVICE C10_ALWAYS_INLINE void add_pack_loss(const AlignedVector<T, kVec>& v, PackClasses c,
                                                const Coefficients<Acc>& w, Acc& all, Acc& pos) {
  Acc x[kVec];
  Softplus<Acc> s[kVec];
  softplus_pack<kPadded>(v, x, s);
  Acc picked = 0;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const bool positive = k == c.positive;
    const Acc loss = focal_terms<kGamma, false>(positive ? -x[k] : x[k], s[k], w.gamma, w.u).loss;
    all += !kPadded || k < c.real ? loss : Acc(0);
    picked = positive ? loss : picked;
  }
  pos += picked;
}

// The pack's gradient: dloss/dy times (1 - alpha) * scale (negative) or -alpha * scale (positive).
template <int kGamma, int kVec, class T, class Acc>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, kVec> pack_grad(const AlignedVector<T, kVec>& v, PackClasses c,
                                                              const Coefficients<Acc>& w, Acc negative_scale,
                                                              Acc positive_scale) {
  Acc x[kVec];
  Softplus<Acc> s[kVec];
  softplus_pack</*kIsolate=*/true>(v, x, s);
  AlignedVector<T, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const bool positive = k == c.positive;
    const Acc g = focal_terms<kGamma, true>(positive ? -x[k] : x[k], s[k], w.gamma, w.u).grad;
    out.value[k] = static_cast<T>(k < c.real ? (positive ? positive_scale : negative_scale) * g : Acc(0));
  }
  return out;
}

template <class Acc>
struct Add {
  C10_DEVICE Acc operator()(Acc a, Acc b) const { return a + b; }
};

// Packs that hold real classes (padding packs past them get zeros, unread), and those of them
// that hold only real classes (no padding: a forward without masks).
template <int kVec>
C10_HOST_DEVICE C10_ALWAYS_INLINE int64_t real_packs(const Problem& p) {
  return (p.real_classes + kVec - 1) / kVec;
}
template <int kVec>
C10_HOST_DEVICE C10_ALWAYS_INLINE int64_t full_packs(const Problem& p) {
  return p.real_classes / kVec;
}

// A thread's walk: packs first, first + stride, ... < end of its rows row, row + step, ...,
// kRowsInFlight rows at a time (row >= rows: no work).
struct Walk {
  int64_t row, step;
  int64_t first, stride, end;
};

// One step of a walk: pack `pack` of the kRowsInFlight rows row, row + step, ..., with their labels
// (kIgnored past the last row) and logits.
template <class T, int kVec>
struct Item {
  int64_t row, pack;
  int64_t label[kRowsInFlight];
  AlignedVector<T, kVec> logits[kRowsInFlight];
};

// Reads an item's labels and, for packs below `loaded`, its logits; the two loads do not wait on
// each other (an ignored row's logits are read and not used).
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void load_item(Item<T, kVec>& item, const Problem& p, int64_t step, int64_t loaded) {
  const T* logits = static_cast<const T*>(p.logits);
#pragma unroll
  for (int i = 0; i < kRowsInFlight; ++i) {
    const int64_t row = item.row + i * step;
    item.label[i] = row < p.rows ? p.labels[row] : kIgnored;
    if (row < p.rows && item.pack < loaded) item.logits[i] = load_vector<kVec>(logits, row * p.classes + item.pack * kVec);
  }
}

// Calls f(item, step) for each item of the walk. Each item is read one step ahead of f, so that a
// thread's next loads are in flight while it computes (at 60-70 registers, occupancy alone would
// not keep enough bytes in flight).
template <class T, int kVec, class F>
C10_DEVICE C10_ALWAYS_INLINE void for_each_item(const Problem& p, const Walk& walk, int64_t loaded, F&& f) {
  Item<T, kVec> item;
  item.row = walk.first < walk.end ? walk.row : p.rows;
  item.pack = walk.first;
  load_item(item, p, walk.step, loaded);
  while (item.row < p.rows) {
    Item<T, kVec> next;
    next.row = item.row;
    next.pack = item.pack + walk.stride;
    if (next.pack >= walk.end) next.row += kRowsInFlight * walk.step, next.pack = walk.first;
    load_item(next, p, walk.step, loaded);
    f(item, walk.step);
    item = next;
  }
}

// The forward's block: `rows` rows x `cols` threads over the packs that hold only real classes
// (threads [0, cols * rows), whole warps where the shape allows), then, when a row's last pack
// also holds padding, one thread per row for it (the next `rows` threads). Warps of the first kind
// never mask a class, which the last pack of every row needs: the two kinds stay in separate warps
// instead of every lane paying for a mask that one lane in twelve needs.
struct ForwardTile {
  int cols, rows, ends;  // ends: threads of the last packs, rows or 0
};

template <class T, int kVec, int kGamma>
__global__ void __launch_bounds__(kMaxForwardThreads) forward_kernel(Problem p, ForwardTile tile, acc_type<T>* partials) {
  using Acc = acc_type<T>;
  __shared__ Acc scratch[kMaxForwardThreads / C10_WARP_SIZE];
  const Coefficients<Acc> w = coefficients_of<Acc>(p);
  const int64_t full = full_packs<kVec>(p), step = static_cast<int64_t>(gridDim.x) * tile.rows;
  const int t = static_cast<int>(threadIdx.x), body = tile.cols * tile.rows;
  Acc all = 0, pos = 0;
  const auto add = [&](auto padded) {
    return [&](const Item<T, kVec>& item, int64_t) {
#pragma unroll
      for (int i = 0; i < kRowsInFlight; ++i) {
        if (item.label[i] != kIgnored) {
          add_pack_loss<kGamma, decltype(padded)::value>(
              item.logits[i], pack_classes<kVec>(item.label[i], item.pack * kVec, p.real_classes), w, all, pos);
        }
      }
    };
  };
  if (t < body) {
    const Walk walk{static_cast<int64_t>(blockIdx.x) * tile.rows + t / tile.cols, step, t % tile.cols, tile.cols, full};
    for_each_item<T, kVec>(p, walk, full, add(std::false_type{}));
  } else if (t < body + tile.ends) {
    const Walk walk{static_cast<int64_t>(blockIdx.x) * tile.rows + (t - body), step, full, 1, real_packs<kVec>(p)};
    for_each_item<T, kVec>(p, walk, walk.end, add(std::true_type{}));
  }
  Acc sum = ((Acc(1) - w.alpha) * (all - pos) + w.alpha * pos) * log_unit<Acc>();
  sum = cuda::block_reduce(sum, Add<Acc>{}, Acc(0), scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

template <class Acc>
__global__ void __launch_bounds__(kMaxThreads) finish_kernel(const Acc* partials, int count, const float* num_positives,
                                                             Acc* loss) {
  __shared__ Acc scratch[kMaxThreads / C10_WARP_SIZE];
  Acc sum = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = cuda::block_reduce(sum, Add<Acc>{}, Acc(0), scratch);
  if (threadIdx.x == 0) *loss = sum / static_cast<Acc>(*num_positives);
}

// The backward's block: cuda::block_tile's `rows` rows x `cols` threads (one per pack of the row,
// up to kMaxThreads), every pack written.
using Tile = cuda::BlockTile;

template <class T, int kVec, int kGamma>
__global__ void __launch_bounds__(kMaxThreads) backward_kernel(Problem p, Tile tile, const acc_type<T>* grad_loss,
                                                               T* grad) {
  using Acc = acc_type<T>;
  const Coefficients<Acc> w = coefficients_of<Acc>(p);
  const Acc scale = *grad_loss / static_cast<Acc>(*p.num_positives_sum);
  const Acc negative_scale = (Acc(1) - w.alpha) * scale, positive_scale = -w.alpha * scale;
  const int64_t counted = real_packs<kVec>(p), packs = p.classes / kVec;
  const int r = static_cast<int>(threadIdx.x) / tile.cols, k = static_cast<int>(threadIdx.x) % tile.cols;
  const Walk walk{r < tile.rows ? static_cast<int64_t>(blockIdx.x) * tile.rows + r : p.rows,
                  static_cast<int64_t>(gridDim.x) * tile.rows, k, tile.cols, packs};
  // Packs past the real classes and ignored rows get zeros, unread.
  for_each_item<T, kVec>(p, walk, counted, [&](const Item<T, kVec>& item, int64_t step) {
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      const int64_t row = item.row + i * step;
      if (row >= p.rows) continue;
      const AlignedVector<T, kVec> out =
          item.pack < counted && item.label[i] != kIgnored
              ? pack_grad<kGamma>(item.logits[i], pack_classes<kVec>(item.label[i], item.pack * kVec, p.real_classes),
                                  w, negative_scale, positive_scale)
              : zeros<T, kVec>();
      store_vector<kVec>(grad, row * p.classes + item.pack * kVec, out);
    }
  });
}

// ---- The rows kernels ----
// Measured first (ncu, H200, bf16, 1M anchors x 96 classes): the general kernels are issue-bound,
// not memory-bound: 76% of issue slots busy, 24.8 SASS instructions an element forward and 36.5
// backward, ~30% of them integer and predicate work (per-item walk, per-element class checks and
// padding selects), against 2.25 special-function ops an element. These kernels remove that
// overhead. Where a row's packs fit one block row (every thread owns one pack column), a thread's
// pack is the same on each of its rows: which of its classes are padding is fixed per thread, so
// padding is masked once per pack on the raw bits (padding logits become kMaskedLogit, whose loss
// and gradient are exactly 0) instead of a compare and a select per element, and every thread runs
// the same unmasked code (no separate warps for the padded last pack). The next rows are a pointer
// step away. The per-element float math is the general kernels' (focal_terms), so losses differ
// only by the order of the sums; the backward's 1 / (1 + e) is taken another way (see there).
// H200, % of copy, fwd / fwd+bwd, against the general kernels: bf16 50.2 / 59.5 -> 51.9 / 64.8,
// fp32 78.3 / 85.6 -> 88.7 / 92.2.

// exp(-200 * log2(e)) underflows to 0 (ftz), so m = 0 and the loss and gradient are exactly 0,
// with every other term finite; -200 is exact in half, bfloat16 and float.
constexpr float kMaskedLogit = -200.0f;
constexpr int kWords = kVectorBytes / static_cast<int>(sizeof(uint32_t));

template <class T>
using BitsOf = std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>;

// A thread's pack column: its first class, the pack's positive index range [0, real), and the
// padding mask (bits & keep | fill) of its raw 16 bytes.
struct Column {
  int64_t first;
  int real;
  uint32_t keep[kWords], fill[kWords];
};

// bfloat16 is the top half of a float: one byte permute (PRMT) per element widens it and, with a
// per-thread selector, replaces padding with kMaskedLogit in the same instruction (the general
// kernels' conversion takes ~1.5 instructions an element, the mask one more a word). `masked` holds
// kMaskedLogit's float bits; selector k picks element k's two bytes into the float's top half and
// zeros from `masked` below them, or all of `masked` for padding.
struct Bf16Column {
  int64_t first;
  int real;
  uint32_t masked;
  uint32_t selector[vector_width<c10::BFloat16>()];
};
constexpr uint32_t kLowHalfToFloat = 0x1054;   // bytes: masked.b0, masked.b1, word.b0, word.b1
constexpr uint32_t kHighHalfToFloat = 0x3254;  // bytes: masked.b0, masked.b1, word.b2, word.b3
constexpr uint32_t kAllMasked = 0x7654;        // masked.b0 .. masked.b3

template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE Column column_of(const Problem& p, int64_t pack) {
  Column c;
  c.first = pack * kVec;
  c.real = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(p.real_classes - c.first, kVec)));
  const T masked = static_cast<T>(kMaskedLogit);
  BitsOf<T> masked_bits, keep[kVec], fill[kVec];
  memcpy(&masked_bits, &masked, sizeof(T));
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    keep[k] = k < c.real ? static_cast<BitsOf<T>>(~BitsOf<T>(0)) : BitsOf<T>(0);
    fill[k] = k < c.real ? BitsOf<T>(0) : masked_bits;
  }
  memcpy(c.keep, keep, sizeof(c.keep));
  memcpy(c.fill, fill, sizeof(c.fill));
  return c;
}

C10_DEVICE C10_ALWAYS_INLINE Bf16Column bf16_column_of(const Problem& p, int64_t pack) {
  constexpr int kVec = vector_width<c10::BFloat16>();
  Bf16Column c;
  c.first = pack * kVec;
  c.real = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(p.real_classes - c.first, kVec)));
  c.masked = __float_as_uint(kMaskedLogit);
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    c.selector[k] = k >= c.real ? kAllMasked : k % 2 == 0 ? kLowHalfToFloat : kHighHalfToFloat;
  }
  return c;
}

// The logits of one row's pack in float, padding masked.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void masked_values(const uint4& raw, const Column& c, float (&x)[kVec]) {
  const uint32_t in[kWords] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t out[kWords];
#pragma unroll
  for (int j = 0; j < kWords; ++j) out[j] = (in[j] & c.keep[j]) | c.fill[j];
  AlignedVector<T, kVec> v;
  memcpy(&v, out, sizeof(v));
#pragma unroll
  for (int k = 0; k < kVec; ++k) x[k] = static_cast<float>(v.value[k]);
}
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void masked_values(const uint4& raw, const Bf16Column& c, float (&x)[kVec]) {
  const uint32_t in[kWords] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < kVec; ++k) x[k] = __uint_as_float(__byte_perm(in[k / 2], c.masked, c.selector[k]));
}

// The column type and its constructor for T.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE auto any_column_of(const Problem& p, int64_t pack) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return bf16_column_of(p, pack);
  } else {
    return column_of<T, kVec>(p, pack);
  }
}

// The row's positive class as an index into the column's pack, or -1 (background, ignored, a
// padding label, another pack's class).
template <class C>
C10_DEVICE C10_ALWAYS_INLINE int positive_in(int64_t label, const C& c) {
  const int64_t at = label - c.first;
  return static_cast<uint64_t>(at) < static_cast<uint64_t>(c.real) ? static_cast<int>(at) : -1;
}

// Two rows of a thread's column: their labels (kIgnored past the last row) and raw packs.
struct RowPair {
  int64_t label[kRowsInFlight];
  uint4 raw[kRowsInFlight];
};

// Calls f(pair, offset, valid) for the thread's rows row, row + step, ... < p.rows, kRowsInFlight
// at a time, with `offset` the first one's pack (element offset; the second is offset + step *
// classes) and `valid` whether the second is a row. Each pair is read one step ahead of f. `read`:
// whether the column holds real classes (else its logits are not read, raw stays 0).
template <class F>
C10_DEVICE C10_ALWAYS_INLINE void for_each_row_pair(const Problem& p, int64_t row, int64_t step, int64_t first,
                                                     size_t bytes_per_element, bool read, F&& f) {
  if (row >= p.rows) return;
  const int64_t count = (p.rows - 1 - row) / step + 1;  // the thread's rows
  const int64_t element_step = step * p.classes;
  const char* logits = static_cast<const char*>(p.logits);
  int64_t offset = row * p.classes + first;
  const int64_t* label = p.labels + row;
  const auto load = [&](RowPair& pair, int64_t done, int64_t at, const int64_t* l) {
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      const bool in = done + i < count;
      pair.label[i] = in ? l[i * step] : kIgnored;
      pair.raw[i] = make_uint4(0, 0, 0, 0);
      if (in && read) {
        pair.raw[i] = *reinterpret_cast<const uint4*>(logits + (at + i * element_step) * bytes_per_element);
      }
    }
  };
  RowPair pair;
  load(pair, 0, offset, label);
  for (int64_t done = 0; done < count; done += kRowsInFlight) {
    RowPair next;
    load(next, done + kRowsInFlight, offset + kRowsInFlight * element_step, label + kRowsInFlight * step);
    f(pair, offset, done + 1 < count);
    pair = next;
    offset += kRowsInFlight * element_step;
    label += kRowsInFlight * step;
  }
}

template <class T, int kVec, int kGamma>
__global__ void __launch_bounds__(kMaxThreads) rows_forward_kernel(Problem p, ForwardTile tile, acc_type<T>* partials) {
  using Acc = acc_type<T>;
  __shared__ Acc scratch[kMaxThreads / C10_WARP_SIZE];
  const Coefficients<Acc> w = coefficients_of<Acc>(p);
  const int r = static_cast<int>(threadIdx.x) / tile.cols, k = static_cast<int>(threadIdx.x) % tile.cols;
  const auto c = any_column_of<T, kVec>(p, k);
  const int64_t row = r < tile.rows ? static_cast<int64_t>(blockIdx.x) * tile.rows + r : p.rows;
  Acc all = 0, pos = 0;
  const auto add_pair = [&](const RowPair& pair, int64_t, bool) {
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      Acc x[kVec];
      Softplus<Acc> s[kVec];
      masked_values<T, kVec>(pair.raw[i], c, x);
      softplus_values</*kIsolate=*/false>(x, s);
      const int positive = positive_in(pair.label[i], c);
      Acc sum, picked = 0;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const bool is_positive = e == positive;
        const Acc loss = focal_terms<kGamma, false>(is_positive ? -x[e] : x[e], s[e], w.gamma, w.u).loss;
        sum = e == 0 ? loss : sum + loss;
        picked = is_positive ? loss : picked;
      }
      // An ignored row (or the missing second row of a thread's last pair) adds nothing; a select,
      // as its logits may be anything.
      const bool counted = pair.label[i] != kIgnored;
      all += counted ? sum : Acc(0);
      pos += counted ? picked : Acc(0);
    }
  };
  for_each_row_pair(p, row, static_cast<int64_t>(gridDim.x) * tile.rows, c.first, sizeof(T), true, add_pair);
  Acc sum = ((Acc(1) - w.alpha) * (all - pos) + w.alpha * pos) * log_unit<Acc>();
  sum = cuda::block_reduce(sum, Add<Acc>{}, Acc(0), scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Blocks of kMaxThreads a SM holds: caps the backward at 85 registers (it takes ~94 unbounded), so
// that four of its 192-thread blocks (24 warps, as the general backward) stay resident.
constexpr int kRowsBackwardBlocks = 3;

// r = 1 / (1 + e) is 2^-log2(1 + e) from the lg2 the element computes anyway: one ex2 instead of
// a quarter of a shared reciprocal, its nine multiplies per four and the NaN isolation
// (reciprocals()); the backward has special-function throughput to spare (~3 ops an element
// against the forward's 2.25, at twice the bytes). ~3e-7 relative on r. SASS per element (bf16,
// 96 / 91 classes): 27.4 against 30.7 with the shared reciprocal; H200 fwd+bwd 64.8% of copy
// against 64.1% (bf16), 92.2% against 91.2% (fp32).
template <class T, int kVec, int kGamma>
__global__ void __launch_bounds__(kMaxThreads, kRowsBackwardBlocks)
    rows_backward_kernel(Problem p, Tile tile, const acc_type<T>* grad_loss, T* grad) {
  using Acc = acc_type<T>;
  const Coefficients<Acc> w = coefficients_of<Acc>(p);
  const Acc scale = *grad_loss / static_cast<Acc>(*p.num_positives_sum);
  const Acc negative_scale = (Acc(1) - w.alpha) * scale, positive_scale = -w.alpha * scale;
  const int r = static_cast<int>(threadIdx.x) / tile.cols, k = static_cast<int>(threadIdx.x) % tile.cols;
  const auto c = any_column_of<T, kVec>(p, k);
  const int64_t row = r < tile.rows ? static_cast<int64_t>(blockIdx.x) * tile.rows + r : p.rows;
  const int64_t element_step = static_cast<int64_t>(gridDim.x) * tile.rows * p.classes;
  const auto write_pair = [&](const RowPair& pair, int64_t offset, bool second) {
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      if (i > 0 && !second) break;
      Acc x[kVec];
      Softplus<Acc> s[kVec];
      masked_values<T, kVec>(pair.raw[i], c, x);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        s[e].e = exp_neg_abs(x[e]);
        s[e].log1p_e = log1p_of(s[e].e, Acc(1) + s[e].e);
        s[e].r = reciprocal_from_log1p(s[e].log1p_e);
      }
      const int positive = positive_in(pair.label[i], c);
      AlignedVector<T, kVec> out;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const bool is_positive = e == positive;
        const Acc g = focal_terms<kGamma, true>(is_positive ? -x[e] : x[e], s[e], w.gamma, w.u).grad;
        out.value[e] = static_cast<T>((is_positive ? positive_scale : negative_scale) * g);
      }
      if (pair.label[i] == kIgnored) out = zeros<T, kVec>();  // whatever its logits
      store_vector<kVec>(grad, offset + i * element_step, out);
    }
  };
  // Columns past the real classes are not read (their masked logits give zeros).
  for_each_row_pair(p, row, static_cast<int64_t>(gridDim.x) * tile.rows, c.first, sizeof(T), c.real > 0,
                    write_pair);
}

// ---- The bf16 rows backward in packed f16x2 ----
//
// ncu (H200, bf16, 1M x 96): the float rows backward is issue-bound (68% of issue slots, 80
// registers, 30% achieved occupancy, ~30 SASS instructions an element). This kernel keeps the three
// special-function ops an element in float (sm_90 has no packed lg2 or rcp, and ex2.approx.f16x2 is
// two MUFU.EX2.F16 plus a PRMT: no cheaper than float's two MUFU and one pack) and moves the rest,
// the O(1) bracket
//   v = 2 q bce + p - u   (grad_y = p^2 v; p = sigmoid(y), q = sigmoid(-y), bce in natural units)
// into f16x2 (two elements an instruction). The small factor p^2 and the scale stay float: p^2 is
// below f16's range (2^-24) from |y| ~ 8.3, where grad_loss / num_positives up to 1e3 still makes
// gradients above the bf16 atol (1e-5), so f = scale * p^2 is one float product and the gradient
// is f * float(v), rounded once to bf16.
//
// Per element, float: x from its bf16 bits (a shift or a mask), y (the positive's sign flip) and its
// scale (two selects), 2e = 2^(1 - |x| log2 e), l = log2(1 + e), p = 2^(min(y, 0) log2 e - l)
// (sigmoid(y) for either sign, no cancellation), f = p (p scale). Per pair, f16x2: y, 2e, l, p
// packed (4 cvt), the mask y < 0 (HSET2), 2q = y >= 0 ? 2e p : 2 - 2p (2 and a LOP3),
// bce = max(y, 0) + l ln 2 - u y (3), v = 2q bce + (p - u) (2); then v to float (2), f v (2), one
// bf16x2 cvt, and one LOP3 a word that zeroes padding classes and ignored rows (their logits are
// not masked on the way in: NaN or inf there computes garbage that this clears).
//
// Range (f16: normal >= 2^-14, max 65504): y is packed with satfinite (|y| <= 65504; bf16 logits
// are exact in f16 down to 2^-14, smaller ones are ~0 either way). With 0 <= u <= 1/2 (smoothing in
// [0, 1]; other smoothings take the float rows backward) no f16 term overflows: max(y, 0) + l ln 2 - u y
// <= 65504 (1 - u) + 0.7 rounds to <= 65504, and for y < 0 it is <= u |y| + 0.7 <= 32753, so 2q bce
// <= 65506 before rounding and v stays finite. Where |y| is that large the factor that multiplies
// it is exactly 0: 2e underflows (y > 0: 2q = 2e p = 0) or p does (y < 0: f = 0). Flushes: 2e and
// l go subnormal below 6e-5 (|y| > 10.4; l ~ 1.44 e) and vanish below 6e-8 (|y| > 17): there they
// are next to terms of size ~1 (y > 0: 2 e y (1 - u) beside p - u >= 1/2 - u) or multiply a
// gradient of size e^3 (y < 0, u = 0: v ~ 3e, grad ~ 3e^3 < 7e-13 scale), below the atol for any
// scale under 1e7. p in f16 only enters 2 - 2p and p - u absolutely (its flushed tail < 6e-8).
//
// Error, step by step (f16 rounding 2^-11 relative an operation; ex2 / lg2.approx and float
// products ~2^-22, negligible): 2e, l, p packed: 1 rounding each; 2q: 2e p or 2 - 2p: 2 deep;
// bce: l ln 2 + max(y, 0), then - u y: 3 deep (u itself rounded once); v = 2q bce + (p - u): 4
// deep. Terms are of one sign except -u: v / (sum of its terms' sizes) >= 1/3 over y, u in [0, 1/2]
// (worst u = 1/2, y large: p - u ~ 1/2 beside p + u). Bound: 4 * 2^-11 * 3 ~ 0.6%; emulated with
// f16 rounding at every step over y in [-20, 20] (step 1e-3) and u = 0, 0.05, 0.25, 0.5, wherever
// the gradient exceeds the atol at scale 750: at most 0.22% relative. Then f v (float, ~2^-23) and
// the bf16 rounding (2^-9, 0.2%): < 0.5% against the bf16 rtol 1.6e-2. fp16 logits (rtol 2e-3)
// and float take the float rows backward.
//
// Capped like the float rows backward (kRowsBackwardBlocks: 80 registers, four 192-thread blocks an
// SM; 4 bytes of spill, one L1 load a row pair). SASS an element (bf16, 96 classes, the row loop):
// 29.0 against the float kernel's 29.75: the packing (2.5 cvt an element) and the v unpack eat most
// of what f16x2 saves on the bracket. H200 (session 32, bench_focal_loss.py, bf16 1M x 96), GB/s
// fwd / fwd+bwd: 2161 / 2803 against 2147 / 2681 and 2141 / 2696 for the float backward (+4%); the
// same kernel capped at 64 registers (five blocks an SM, 8 bytes of spill) gave 2145 / 2731: a fifth
// block an SM did not pay for its spills.

// Whether a bf16 rows backward takes the f16x2 kernel: 0 <= smoothing <= 1 (the f16 range argument
// above needs u <= 1/2).
bool f16x2_backward_applies(const Problem& p) { return p.smoothing >= 0.0 && p.smoothing <= 1.0; }

C10_DEVICE C10_ALWAYS_INLINE float ex2_approx(float v) {
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(v));
  return out;
}
C10_DEVICE C10_ALWAYS_INLINE float lg2_approx(float v) {
  float out;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(v));
  return out;
}
// f16x2 / bf16x2 words: low half = element 2j, high half = element 2j + 1 (memory order). Each packed
// PTX instruction the kernel uses, as a function of 32-bit words, spelled once by these macros.
#define APEX_PACK_TWO_FLOATS(name, ptx)                                                   \
  C10_DEVICE C10_ALWAYS_INLINE uint32_t name(float low, float high) {                     \
    uint32_t out;                                                                          \
    asm(ptx " %0, %1, %2;" : "=r"(out) : "f"(high), "f"(low));                             \
    return out;                                                                            \
  }
#define APEX_PACKED_BINARY(name, ptx)                                                     \
  C10_DEVICE C10_ALWAYS_INLINE uint32_t name(uint32_t a, uint32_t b) {                    \
    uint32_t out;                                                                          \
    asm(ptx " %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));                                  \
    return out;                                                                            \
  }
APEX_PACK_TWO_FLOATS(f16x2_of, "cvt.rn.f16x2.f32")
APEX_PACK_TWO_FLOATS(f16x2_saturated_of, "cvt.rn.satfinite.f16x2.f32")
APEX_PACK_TWO_FLOATS(bf16x2_of, "cvt.rn.bf16x2.f32")
APEX_PACKED_BINARY(hmul2, "mul.rn.f16x2")
APEX_PACKED_BINARY(hadd2, "add.rn.f16x2")
APEX_PACKED_BINARY(hmax2, "max.f16x2")
APEX_PACKED_BINARY(hlt2_mask, "set.lt.u32.f16x2")  // 0xffff in each half where a < b, else 0
#undef APEX_PACK_TWO_FLOATS
#undef APEX_PACKED_BINARY

C10_DEVICE C10_ALWAYS_INLINE void floats_of_f16x2(uint32_t v, float& low, float& high) {
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}"
      : "=f"(low), "=f"(high) : "r"(v));
}
C10_DEVICE C10_ALWAYS_INLINE uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t out;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(c));
  return out;
}

// The low min(n, 32) bits set (n >= 0): one funnel shift, where the bits of a word's real classes as
// two compares and selects are what ptxas rematerializes each row.
C10_DEVICE C10_ALWAYS_INLINE uint32_t low_bits(int n) {
  uint32_t out;
  asm("shf.l.clamp.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(~0u), "r"(0u), "r"(n));
  return out;
}

// f16x2 constants (both halves).
constexpr uint32_t kF16x2Zero = 0x00000000u;
constexpr uint32_t kF16x2Two = 0x40004000u;        // 2.0
constexpr uint32_t kF16x2MinusTwo = 0xc000c000u;   // -2.0
constexpr uint32_t kF16x2Ln2 = 0x398c398cu;        // ln 2 = 0.69336 in f16 (rel. error 3.1e-4 < 2^-11)

struct Half2Coefficients {
  float negative_scale, positive_scale;  // (1 - alpha) scale, -alpha scale
  uint32_t minus_u;                      // -u in both halves
};

// The gradient of one row's pack of 8 bf16 logits (raw) whose first `real` are real classes,
// `positive` the row's positive class in the pack or -1, `row_keep` 0 for an ignored row (else all
// ones). Padding and ignored rows are not masked on the way in (Bf16Column's eight PRMT selectors,
// which the default backward rematerializes every row at 80 registers: a compare and a select an
// element): whatever they compute, NaN included, is cleared in the output words, one LOP3 a word
// with the row's mask.
C10_DEVICE C10_ALWAYS_INLINE uint4 half2_pack_grad(const uint4& raw, int real, int positive, uint32_t row_keep,
                                                   const Half2Coefficients& w) {
  const uint32_t in[kWords] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t out[kWords];
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    // bf16 is a float's top half.
    const float xs[2] = {__uint_as_float(in[j] << 16), __uint_as_float(in[j] & 0xffff0000u)};
    float y[2], two_e[2], l[2], p[2], f[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float x = xs[h];
      const bool is_positive = 2 * j + h == positive;
      y[h] = is_positive ? -x : x;
      const float scale = is_positive ? w.positive_scale : w.negative_scale;
      two_e[h] = ex2_approx(fmaf(fabsf(x), -kLog2e, 1.0f));    // 2 exp(-|y|)
      l[h] = lg2_approx(fmaf(two_e[h], 0.5f, 1.0f));           // log2(1 + e)
      p[h] = ex2_approx(fmaf(fminf(y[h], 0.0f), kLog2e, -l[h]));  // sigmoid(y) = 2^(min(y, 0) log2 e) / (1 + e)
      f[h] = p[h] * (p[h] * scale);
    }
    const uint32_t yh = f16x2_saturated_of(y[0], y[1]);
    const uint32_t ph = f16x2_of(p[0], p[1]);
    const uint32_t negative = hlt2_mask(yh, kF16x2Zero);
    // 2 sigmoid(-y): 2e p (= 2e / (1 + e)) for y >= 0, 2 - 2p for y < 0 (p <= 1/2: no cancellation).
    const uint32_t two_q = (hmul2(f16x2_of(two_e[0], two_e[1]), ph) & ~negative) |
                           (hfma2(ph, kF16x2MinusTwo, kF16x2Two) & negative);
    // bce = max(y, 0) + ln(1 + e) - u y.
    const uint32_t bce = hfma2(yh, w.minus_u, hfma2(f16x2_of(l[0], l[1]), kF16x2Ln2, hmax2(yh, kF16x2Zero)));
    const uint32_t v = hfma2(two_q, bce, hadd2(ph, w.minus_u));
    float v0, v1;
    floats_of_f16x2(v, v0, v1);
    out[j] = bf16x2_of(f[0] * v0, f[1] * v1) & low_bits(std::max(16 * real - 32 * j, 0)) & row_keep;
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

template <int kVec>
__global__ void __launch_bounds__(kMaxThreads, kRowsBackwardBlocks)
    rows_backward_half2_kernel(Problem p, Tile tile, const float* grad_loss, c10::BFloat16* grad) {
  const float scale = *grad_loss / *p.num_positives_sum;
  const float alpha = static_cast<float>(p.alpha);
  const c10::Half minus_u(static_cast<float>(-p.smoothing / 2));
  const Half2Coefficients w{(1.0f - alpha) * scale, -alpha * scale, static_cast<uint32_t>(minus_u.x) * 0x10001u};
  const int r = static_cast<int>(threadIdx.x) / tile.cols, k = static_cast<int>(threadIdx.x) % tile.cols;
  const Bf16Column c = bf16_column_of(p, k);  // first and real (its selectors go unused)
  const int64_t row = r < tile.rows ? static_cast<int64_t>(blockIdx.x) * tile.rows + r : p.rows;
  const int64_t element_step = static_cast<int64_t>(gridDim.x) * tile.rows * p.classes;
  const auto write_pair = [&](const RowPair& pair, int64_t offset, bool second) {
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      if (i > 0 && !second) break;
      const uint32_t row_keep = pair.label[i] == kIgnored ? 0u : ~0u;  // whatever its logits
      *reinterpret_cast<uint4*>(grad + offset + i * element_step) =
          half2_pack_grad(pair.raw[i], c.real, positive_in(pair.label[i], c), row_keep, w);
    }
  };
  for_each_row_pair(p, row, static_cast<int64_t>(gridDim.x) * tile.rows, c.first, sizeof(c10::BFloat16), c.real > 0,
                    write_pair);
}

int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

// cols = the full packs (up to kMaxThreads); rows: a multiple of kWarp / gcd(cols, kWarp), so that
// the cols x rows threads are whole warps, about kMaxThreads of them; else (a block that would not
// fit) as many rows as fit kMaxThreads.
ForwardTile forward_tile_for(int64_t full, bool has_end) {
  const int cols = static_cast<int>(std::min<int64_t>(full, kMaxThreads));
  if (cols == 0) return {0, kMaxThreads, kMaxThreads};
  const int unit = kWarp / gcd(cols, kWarp);
  int rows = unit * std::max(1, kMaxThreads / (cols * unit));
  if (cuda::whole_warps(cols * rows) + (has_end ? rows : 0) > kMaxForwardThreads) rows = std::max(1, kMaxThreads / cols);
  return {cols, rows, has_end ? rows : 0};
}

// Blocks for the rows (`rows` x kRowsInFlight per block and step), at most as many as are resident
// at once: one wave, the row loops do the rest.
unsigned blocks_for(const Problem& p, int rows, int threads, const void* kernel, const Cuda& device) {
  const int64_t rows_per_block = static_cast<int64_t>(rows) * kRowsInFlight;
  const int64_t wanted = (p.rows + rows_per_block - 1) / rows_per_block;
  const int64_t resident = static_cast<int64_t>(cuda::sm_count(device.device)) *
                           cuda::resident_blocks_per_sm(kernel, threads, 0, device.device);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(wanted, resident)));
}

// Rows of 16-byte packs need a class count that keeps every row 16-byte aligned.
template <class T>
bool vectorizable(const Problem& p, const void* out) {
  return p.classes % vector_width<T>() == 0 && is_aligned(p.logits) && (out == nullptr || is_aligned(out));
}

template <class T>
using ForwardKernel = void (*)(Problem, ForwardTile, acc_type<T>*);

template <class T>
struct ForwardLaunch {
  ForwardKernel<T> kernel;
  ForwardTile tile;
  unsigned blocks, threads;
};

// The rows kernels exist for packed 16-bit or float logits; they take gamma 2 (kMaskedLogit's zeros
// need m = p^2) and rows of `packs` packs that fit one block row. Every other case takes the general
// kernels.
template <class T, int kVec>
constexpr bool kHasRowsKernels = kVec > 1 && sizeof(T) <= sizeof(float);

bool rows_apply(const Problem& p, int64_t packs) {
  return p.gamma == 2.0 && packs > 0 && packs <= kMaxThreads;
}

template <class T, int kVec>
ForwardLaunch<T> forward_launch_with(const Problem& p, const Cuda& device) {
  if constexpr (kHasRowsKernels<T, kVec>) {
    if (rows_apply(p, real_packs<kVec>(p))) {
      const Tile t = cuda::block_tile(real_packs<kVec>(p), kMaxThreads);
      const int threads = cuda::whole_warps(t.cols * t.rows);
      const ForwardKernel<T> kernel = rows_forward_kernel<T, kVec, kGammaTwo>;
      return {kernel, ForwardTile{t.cols, t.rows, 0},
              blocks_for(p, t.rows, threads, reinterpret_cast<const void*>(kernel), device),
              static_cast<unsigned>(threads)};
    }
  }
  const ForwardTile tile = forward_tile_for(full_packs<kVec>(p), real_packs<kVec>(p) > full_packs<kVec>(p));
  const int threads = cuda::whole_warps(tile.cols * tile.rows + tile.ends);
  const ForwardKernel<T> kernel =
      with_gamma(p, [](auto gamma) -> ForwardKernel<T> { return forward_kernel<T, kVec, decltype(gamma)::value>; });
  return {kernel, tile, blocks_for(p, tile.rows, threads, reinterpret_cast<const void*>(kernel), device),
          static_cast<unsigned>(threads)};
}

// The forward's kernel and launch (partials_size needs its block count).
template <class T>
ForwardLaunch<T> forward_launch(const Problem& p, const Cuda& device) {
  return vectorizable<T>(p, nullptr) ? forward_launch_with<T, vector_width<T>()>(p, device)
                                     : forward_launch_with<T, 1>(p, device);
}

template <class T, int kVec>
void launch_backward(const Problem& p, const acc_type<T>* grad_loss, T* grad, const Cuda& device) {
  const Tile tile = cuda::block_tile(p.classes / kVec, kMaxThreads);
  const int threads = cuda::whole_warps(tile.cols * tile.rows);
  // Every backward kernel takes the same arguments and one wave of `tile` blocks.
  const auto launch = [&](auto kernel) {
    const unsigned blocks = blocks_for(p, tile.rows, threads, reinterpret_cast<const void*>(kernel), device);
    kernel<<<blocks, threads, 0, cuda::stream(device)>>>(p, tile, grad_loss, grad);
  };
  if constexpr (kHasRowsKernels<T, kVec>) {
    if (rows_apply(p, p.classes / kVec)) {
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        if (f16x2_backward_applies(p)) return launch(rows_backward_half2_kernel<kVec>);
      }
      return launch(rows_backward_kernel<T, kVec, kGammaTwo>);
    }
  }
  with_gamma(p, [&](auto gamma) {
    launch(backward_kernel<T, kVec, decltype(gamma)::value>);
  });
}

}  // namespace

int64_t partials_size(const Cuda& device, const Problem& p) {
  return dispatch_floating(p.dtype, [&](auto tag) {
    return static_cast<int64_t>(forward_launch<typename decltype(tag)::type>(p, device).blocks);
  });
}

void forward(const Cuda& device, const Problem& p, void* partials, void* loss) {
  dispatch_floating(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_type<T>;
    const cudaStream_t stream = cuda::stream(device);
    const ForwardLaunch<T> launch = forward_launch<T>(p, device);
    Acc* sums = static_cast<Acc*>(partials);
    launch.kernel<<<launch.blocks, launch.threads, 0, stream>>>(p, launch.tile, sums);
    finish_kernel<Acc><<<1, kMaxThreads, 0, stream>>>(sums, static_cast<int>(launch.blocks), p.num_positives_sum,
                                                      static_cast<Acc*>(loss));
  });
  cuda::check_launch("focal_loss_forward");
}

void backward(const Cuda& device, const Problem& p, const void* grad_loss, void* grad) {
  if (p.rows == 0 || p.classes == 0) return;
  dispatch_floating(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* g = static_cast<const acc_type<T>*>(grad_loss);
    T* out = static_cast<T*>(grad);
    if (vectorizable<T>(p, grad)) {
      launch_backward<T, vector_width<T>()>(p, g, out, device);
    } else {
      launch_backward<T, 1>(p, g, out, device);
    }
  });
  cuda::check_launch("focal_loss_backward");
}

}  // namespace apex::focal_loss
