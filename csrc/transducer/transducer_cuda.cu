// transducer: CUDA kernels.
//  joint:  the forward's threads each own (b, t, 16-byte pack of H): f's pack stays in registers
//          while they walk u, storing h (and mask) one vector per step. The backward reads h_grad
//          once: each thread walks u for a few frames, keeping f_grad's sums over u in registers
//          and adding g_grad's sums over t in shared memory, in a fixed order (joint_backward_kernel).
//          A ReLU mask the forward did not store is recomputed there from f and g.
//  loss:   a group of lanes per lattice row (several rows a warp for short rows; a block per row
//          past 16 KiB, apex/row_softmax.cuh) computes the row's log-sum-exp in one pass over its
//          logits, loaded before use, and the log-probabilities of blank and label; a wavefront
//          kernel (one block per batch element and direction) runs alpha and beta over the
//          lattice's anti-diagonals, a thread per u passing values on through registers and shared
//          memory; the backward writes each row's gradient in one more pass. No softmax or
//          log-softmax tensor is ever stored.
#include "apex/cuda.cuh"
#include "apex/fast_exp2.cuh"
#include "apex/block_reduce.cuh"
#include "apex/occupancy.cuh"
#include "apex/row_softmax.cuh"
#include "transducer.h"
#include "transducer_math.h"

namespace apex::transducer {
namespace {

using namespace apex::cuda;

constexpr int kThreads = 256;
constexpr int kRowUnroll = 4;          // 16-byte loads in flight per thread over a logits row
constexpr int kMinRowThreads = 64;
constexpr int kMaxRowThreads = 256;
constexpr int kMaxWavefrontThreads = 1024;

// ---- joint ---------------------------------------------------------------------------------

// A joint block's threads (1-D, whole warps) are a cuda::BlockTile of `rows` x `cols`: thread (r, k)
// is threadIdx.x = r * cols + k and works on packs k, k + cols, ... of its row (of frames in the
// forward, of frames' lanes in the backward); threads past rows * cols idle.

// Where row (b, t, u) of the lattice starts: row_base(t) + u (unpacked rows of every (t, u); packed
// only those of t < t_len, u < u_len).
C10_DEVICE C10_ALWAYS_INLINE int64_t row_base(const Lattice& l, int64_t b, int64_t t, int64_t u_len) {
  return l.batch_offset == nullptr ? (b * l.max_t + t) * l.max_u : batch_start(l, b) + t * u_len;
}

// A vector's kVec mask (or dropout keep) bytes as one integer, byte e in bits [8e, 8e + 8): one or
// two registers where an array of bytes took kVec (the backward keeps 8 such vectors in flight).
template <int kVec>
using MaskBits = std::conditional_t<(kVec > 4), uint64_t, uint32_t>;

template <int kVec, class M>
C10_DEVICE C10_ALWAYS_INLINE MaskBits<kVec> load_mask_bits(const M* mask, int64_t at) {
  static_assert(sizeof(M) == 1, "masks are bytes");
  // One load of kVec bytes (a kVec-aligned offset of an aligned row, as the vectors of the data).
  using Word = std::conditional_t<kVec == 8, uint64_t,
                                  std::conditional_t<kVec == 4, uint32_t, std::conditional_t<kVec == 2, uint16_t, uint8_t>>>;
  static_assert(sizeof(Word) == kVec, "one mask byte per element of a vector");
  return *reinterpret_cast<const Word*>(mask + at);
}

template <class Bits>
C10_DEVICE C10_ALWAYS_INLINE bool mask_byte(Bits bits, int e) {
  return (bits & (Bits(0xff) << (8 * e))) != 0;
}

// A vector's values as M. bfloat16 to float from its 32-bit words (value 2k: word k shifted up;
// 2k + 1: word k, low half cleared), which keeps the loaded words in their registers until used: the
// generic conversion had every 16-bit value unpacked into a register of its own ahead, doubling the
// registers a thread held (a loss row group's 120 -> 75).
template <class M, class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void convert(const AlignedVector<T, kVec>& v, M* out) {
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<M, float> && kVec % 2 == 0) {
    uint32_t words[kVec / 2];
    memcpy(words, &v, sizeof(words));
#pragma unroll
    for (int k = 0; k < kVec / 2; ++k) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = static_cast<M>(v.value[e]);
  }
}

// A joint forward block item: batch element, group of tile.rows frames, and span of `span` steps of
// u (spans of a few steps make many items, so that the last wave of a grid-stride loop is short).
constexpr int64_t kForwardItemSteps = 16;
struct ForwardItems {
  int64_t groups;  // frame groups per batch element
  int64_t spans;   // spans of u per frame group
  int64_t span;    // steps per span (the last span of a packed batch element runs to its u_len)
};

// h[b, t, u] = f[b, t] + g[b, u] (ReLU, dropout) for thread (frame t, pack k) of block item (b,
// frame group, span of u): f's pack is read once and kept in registers, g's packs (L1 / L2 hits: all
// frames of b share them) kUnroll at a time, and every step stores one 16-byte vector of h (and one
// of mask, when one is written). The stores are the kernel's traffic, rows of H contiguous per warp.
template <class T, int kVec>
__global__ void __launch_bounds__(kThreads) joint_forward_kernel(JointArgs a, BlockTile tile, ForwardItems items) {
  constexpr int kUnroll = 4;
  const T* f = static_cast<const T*>(a.f);
  const T* g = static_cast<const T*>(a.g);
  T* h = static_cast<T*>(a.h);
  const Lattice& l = a.lattice;
  const int64_t packs = a.width / kVec;
  const int r = static_cast<int>(threadIdx.x) / tile.cols, k = static_cast<int>(threadIdx.x) % tile.cols;
  const bool packed = l.batch_offset != nullptr, dropout = a.keep != nullptr;
  const int64_t per_batch = items.groups * items.spans;
  for (int64_t item = blockIdx.x; item < l.batch * per_batch && r < tile.rows; item += gridDim.x) {
    const int64_t b = item / per_batch, t = item % per_batch / items.spans * tile.rows + r, span = item % items.spans;
    if (t >= l.max_t) continue;
    const int64_t u_len = l.u_len[b];
    const bool frame = t < l.t_len[b];
    if (packed && !frame) continue;  // no rows
    const int64_t base = row_base(l, b, t, u_len), all_steps = packed ? u_len : l.max_u;
    const int64_t first = span * items.span;
    const int64_t steps = span + 1 == items.spans ? all_steps : std::min(all_steps, first + items.span);
    for (int64_t pack = k; pack < packs; pack += tile.cols) {
      float fv[kVec];
      if (frame) {
        const auto v = load_vector<kVec>(f, (b * l.max_t + t) * a.width + pack * kVec);
#pragma unroll
        for (int e = 0; e < kVec; ++e) fv[e] = static_cast<float>(v.value[e]);
      }
      for (int64_t u0 = first; u0 < steps; u0 += kUnroll) {
        AlignedVector<T, kVec> gv[kUnroll];
        MaskBits<kVec> keep[kUnroll];
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          const int64_t u = u0 + i;
          if (frame && u < u_len && u < steps) {
            gv[i] = load_vector<kVec>(g, (b * l.max_u + u) * a.width + pack * kVec);
            if (dropout) keep[i] = load_mask_bits<kVec>(a.keep, (base + u) * a.width + pack * kVec);
          }
        }
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          const int64_t u = u0 + i;
          if (u >= steps) break;
          AlignedVector<T, kVec> out;
          AlignedVector<uint8_t, kVec> passed;
          if (frame && u < u_len) {
#pragma unroll
            for (int e = 0; e < kVec; ++e) {
              float v = fv[e] + static_cast<float>(gv[i].value[e]);
              bool pass = !(a.relu && v <= 0.0f);
              if (dropout) pass = pass && mask_byte(keep[i], e);
              v = pass ? (dropout ? v * a.scale : v) : 0.0f;
              out.value[e] = static_cast<T>(v);
              passed.value[e] = pass;
            }
          } else {  // don't-care rows of the unpacked layout
#pragma unroll
            for (int e = 0; e < kVec; ++e) out.value[e] = T(-1), passed.value[e] = 0;
          }
          const int64_t at = (base + u) * a.width + pack * kVec;
          store_vector<kVec>(h, at, out);
          if (a.mask != nullptr) store_vector<kVec>(a.mask, at, passed);
        }
      }
    }
  }
  // Packed rows past the last batch's (a packed_batch larger than the lattice): don't care.
  if (packed) {
    const int64_t first = l.batch > 0 ? l.batch_offset[l.batch - 1] : 0, tail = (l.rows - first) * packs;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < tail;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t at = (first + i / packs) * a.width + i % packs * kVec;
      AlignedVector<T, kVec> out;
      AlignedVector<uint8_t, kVec> passed;
#pragma unroll
      for (int e = 0; e < kVec; ++e) out.value[e] = T(-1), passed.value[e] = 0;
      store_vector<kVec>(h, at, out);
      if (a.mask != nullptr) store_vector<kVec>(a.mask, at, passed);
    }
  }
}

// The backward's plan: blocks of (batch b, chunk of `packs` packs of H, split of `frames` frames),
// kThreads threads as `lanes` frame lanes x `packs` (thread (lane, k) = threadIdx.x = lane * packs
// + k). A thread owns frames t0 + lane + j * lanes, j < kFramesPerLane, and walks u: f_grad's sums
// over u stay in its registers; g_grad's sums over t add its frames, then the block's lanes through
// shared memory in a fixed order, kSteps values of u at a time. With one split each block writes
// g_grad; with more, partial sums (`workspace`) that joint_g_finish_kernel adds in order. h_grad
// (and mask) are read once, each step's loads issued before the previous step's reduction.
constexpr int kFramesPerLane = 4;
constexpr int kSteps = 2;
constexpr int kMaxChunkPacks = 8;  // 8 x 16 bytes: each frame lane of a warp reads 128 contiguous bytes

struct BackwardPlan {
  int packs, lanes;        // per block
  int64_t chunks;          // of H
  int64_t splits, frames;  // of T
  unsigned blocks;
};

// What gates h_grad: a.mask, if any (kMask); ReLU recomputed from a.f and a.g (kRelu); or either, as
// the arguments say (kAny). The 16-byte kernels come as kMask and kRelu: the recomputation's
// registers (f's and g's packs) next to the mask's took the float kernel from 2 resident blocks per
// SM to 1. The scalar fallback (odd H, misaligned tensors) is one kAny kernel: fewer to compile.
enum class Gate { kMask, kRelu, kAny };

template <class T, int kVec, Gate kGate>
__global__ void __launch_bounds__(kThreads) joint_backward_kernel(JointBackwardArgs a, BackwardPlan plan) {
  // Per step of u, per lane, the lane's sums over its frames: [buffer][step][lane][width + 1]
  // (padded against bank conflicts in the reduction), two buffers so that one barrier per step
  // suffices: a buffer is rewritten only after the next barrier, past every read of it.
  constexpr int kBuffer = kSteps * (kThreads * kVec + kThreads);
  __shared__ float lanes_sum[2 * kBuffer];
  const T* h_grad = static_cast<const T*>(a.h_grad);
  const Lattice& l = a.lattice;
  const int64_t packs = a.width / kVec, split = blockIdx.x % plan.splits;
  const int64_t chunk = blockIdx.x / plan.splits % plan.chunks, b = blockIdx.x / plan.splits / plan.chunks;
  const int lane = static_cast<int>(threadIdx.x) / plan.packs, k = static_cast<int>(threadIdx.x) % plan.packs;
  const int width = plan.packs * kVec, stride = width + 1;  // the chunk's, and its rows' in lanes_sum
  const int64_t pack = chunk * plan.packs + k;
  const bool active = lane < plan.lanes && pack < packs;
  const int64_t t_len = std::min(l.t_len[b], l.max_t), u_len = l.u_len[b];
  const int64_t g_rows = std::min(u_len, l.max_u);                          // g_grad rows with sums
  const int64_t u_end = l.batch_offset == nullptr ? g_rows : u_len;         // the u of f_grad's sums
  const int64_t t0 = split * plan.frames, t_end = std::min(t0 + plan.frames, l.max_t);
  int64_t at[kFramesPerLane];  // element offset of (t, u = 0) in h_grad, or -1: no frame
#pragma unroll
  for (int j = 0; j < kFramesPerLane; ++j) {
    const int64_t t = t0 + lane + j * static_cast<int64_t>(plan.lanes);
    at[j] = active && t < t_end && t < t_len ? row_base(l, b, t, u_len) * a.width + pack * kVec : -1;
  }
  // Without a mask, ReLU's may be recomputed from the inputs (a.f, a.g): h_grad passes where
  // !(f[b, t] + g[b, u] <= 0), the forward's test on the same float sum. The frames' packs of f stay
  // in registers; g's pack of each step is loaded with h_grad's (one for all the thread's frames).
  const T* f = static_cast<const T*>(a.f);
  const T* g = static_cast<const T*>(a.g);
  const bool relu = kGate == Gate::kRelu || (kGate == Gate::kAny && a.mask == nullptr && a.f != nullptr);
  AlignedVector<T, kVec> f_pack[kFramesPerLane] = {}, g_pack[kSteps] = {};
  if (relu) {
#pragma unroll
    for (int j = 0; j < kFramesPerLane; ++j) {
      const int64_t t = t0 + lane + j * static_cast<int64_t>(plan.lanes);
      if (at[j] >= 0) f_pack[j] = load_vector<kVec>(f, (b * l.max_t + t) * a.width + pack * kVec);
    }
  }
  AlignedVector<T, kVec> v[kSteps][kFramesPerLane];
  MaskBits<kVec> m[kSteps][kFramesPerLane];
  const auto load = [&](int64_t u0) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
      for (int j = 0; j < kFramesPerLane; ++j) {
        if (at[j] >= 0 && u0 + s < u_end) {
          v[s][j] = load_vector<kVec>(h_grad, at[j] + (u0 + s) * a.width);
          if (!relu && a.mask != nullptr) m[s][j] = load_mask_bits<kVec>(a.mask, at[j] + (u0 + s) * a.width);
        }
      }
      // (Packed lengths past g's rows are bad input; nothing is read past them.)
      if (relu && active && u0 + s < u_end && u0 + s < l.max_u) {
        g_pack[s] = load_vector<kVec>(g, (b * l.max_u + u0 + s) * a.width + pack * kVec);
      }
    }
  };
  // The reduction over lanes: `group` threads per output value (a power of two, lanes of one warp)
  // each add every group-th lane, then combine by shuffles.
  const int outputs = kSteps * width;
  int group = 1;
  while (group * 2 <= C10_WARP_SIZE && group * 2 * outputs <= kThreads) group *= 2;
  float f_sum[kFramesPerLane][kVec] = {};
  load(0);
  for (int64_t u0 = 0, buffer = 0; u0 < u_end; u0 += kSteps, buffer ^= 1) {
    float* sums = lanes_sum + buffer * kBuffer;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      float g_sum[kVec] = {};
#pragma unroll
      for (int j = 0; j < kFramesPerLane; ++j) {
        if (at[j] < 0 || u0 + s >= u_end || (relu && u0 + s >= l.max_u)) continue;
        float x[kVec], fx[kVec], gx[kVec];
        convert(v[s][j], x);
        if (relu) {
          convert(f_pack[j], fx);
          convert(g_pack[s], gx);
        }
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const bool pass = relu ? !(fx[e] + gx[e] <= 0.0f) : a.mask == nullptr || mask_byte(m[s][j], e);
          x[e] = pass ? x[e] : 0.0f;
          f_sum[j][e] += x[e];
          g_sum[e] += x[e];
        }
      }
      if (lane < plan.lanes) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) sums[(s * plan.lanes + lane) * stride + k * kVec + e] = g_sum[e];
      }
    }
    load(u0 + kSteps);  // in flight through the barrier and the reduction
    __syncthreads();
    for (int o0 = 0; o0 < outputs * group; o0 += kThreads) {
      const int o = (o0 + static_cast<int>(threadIdx.x)) / group, part = static_cast<int>(threadIdx.x) % group;
      const int s = o / width, column = o % width;
      float sum = 0.0f;
      if (o < outputs) {
        for (int i = part; i < plan.lanes; i += group) sum += sums[(s * plan.lanes + i) * stride + column];
      }
      sum = group_reduce(sum, group, [](float x, float y) { return x + y; });
      const int64_t u = u0 + s, h = chunk * width + column;
      if (o < outputs && part == 0 && u < g_rows && h < a.width) {
        if (a.workspace == nullptr) {
          static_cast<T*>(a.g_grad)[(b * l.max_u + u) * a.width + h] = static_cast<T>(sum * a.scale);
        } else {
          a.workspace[((split * l.batch + b) * l.max_u + u) * a.width + h] = sum;
        }
      }
    }
  }
  if (active) {
    T* f_grad = static_cast<T*>(a.f_grad);
#pragma unroll
    for (int j = 0; j < kFramesPerLane; ++j) {
      const int64_t t = t0 + lane + j * static_cast<int64_t>(plan.lanes);
      if (t >= t_end) continue;
      AlignedVector<T, kVec> out;  // zeros past t_len
#pragma unroll
      for (int e = 0; e < kVec; ++e) out.value[e] = static_cast<T>(f_sum[j][e] * a.scale);
      store_vector<kVec>(f_grad, (b * l.max_t + t) * a.width + pack * kVec, out);
    }
  }
  // g_grad past u_len: zeros (with splits, joint_g_finish_kernel writes them).
  if (a.workspace == nullptr) {
    for (int64_t o = threadIdx.x; o < (l.max_u - g_rows) * width; o += blockDim.x) {
      const int64_t h = chunk * width + o % width;
      if (h < a.width) static_cast<T*>(a.g_grad)[(b * l.max_u + g_rows + o / width) * a.width + h] = T(0);
    }
  }
}

// g_grad[b, u] = scale * the sum of the splits' partial sums (0 past u_len), one block per (b, u).
template <class T>
__global__ void __launch_bounds__(kThreads) joint_g_finish_kernel(JointBackwardArgs a, int64_t splits) {
  const Lattice& l = a.lattice;
  T* g_grad = static_cast<T*>(a.g_grad);
  const int64_t stride = l.batch * l.max_u * a.width;
  for (int64_t row = blockIdx.x; row < l.batch * l.max_u; row += gridDim.x) {
    const int64_t b = row / l.max_u, u = row % l.max_u;
    const bool inside = u < l.u_len[b];
    for (int64_t h = threadIdx.x; h < a.width; h += blockDim.x) {
      float sum = 0.0f;
      if (inside) {
        for (int64_t s = 0; s < splits; ++s) sum += a.workspace[s * stride + row * a.width + h];
      }
      g_grad[row * a.width + h] = static_cast<T>(sum * a.scale);
    }
  }
}

template <class T, class Launch>
void with_vector_width(int64_t width, std::initializer_list<const void*> pointers, Launch&& launch) {
  constexpr int kVec = vector_width<T>();
  bool aligned = width % kVec == 0;
  for (const void* p : pointers) aligned = aligned && (p == nullptr || is_aligned(p));
  if (aligned) {
    launch(std::integral_constant<int, kVec>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

// ---- loss ----------------------------------------------------------------------------------

// Rows of up to kMaxGroupRowBytes go to groups of lanes (loss_rows_group_kernel): each lane issues
// kRowPacks 16-byte loads of its row before it uses any (a 2 KB row, V = 1024 fp16, is 16 lanes'
// one round trip), and a group merges its statistics by shuffles: no shared memory, no barrier.
// Longer rows take a block each (loss_rows_kernel), many threads on one row.
constexpr int kRowPacks = 8;
constexpr int64_t kMaxGroupRowBytes = 16 * 1024;

// Lanes per row: the power of two that covers a row's vectors at kRowPacks a lane, at most a warp
// (longer rows loop, kRowPacks vectors a lane per pass). Shorter rows share a warp.
int row_group_lanes(int64_t classes, int vec) {
  const int64_t packs = (classes + vec - 1) / vec;
  int lanes = 1;
  while (lanes < kPlanWarp && static_cast<int64_t>(lanes) * kRowPacks < packs) lanes *= 2;
  return lanes;
}


// Whether cell c has a label transition (u < u_len - 1).
C10_DEVICE C10_ALWAYS_INLINE bool has_label(const Lattice& l, const Cell& c) {
  return c.valid && c.u + 1 < l.u_len[c.b];
}

// A row's log-sum-exp, and log-probabilities of blank and label (rounded to T: what NVIDIA apex's
// log_softmax in x's dtype gives); 0 for rows outside the lengths, and for a label where none is.
template <class T>
C10_DEVICE C10_ALWAYS_INLINE void write_row_terms(const LossArgs& a, bool valid, bool labelled, int64_t row, float lse,
                                                  float blank, float label) {
  const auto logp = [&](float logit) { return static_cast<float>(static_cast<T>(logit - lse)); };
  a.lse[row] = valid ? lse : 0.0f;
  a.blank_logp[row] = valid ? logp(blank) : 0.0f;
  a.label_logp[row] = labelled ? logp(label) : 0.0f;
}

// Rows of the lattice by groups of `lanes` lanes (a power of two dividing the warp; warp / lanes rows
// per warp at once). A row splits as 16-byte accesses see it (RowSplit: scalars before the first
// aligned vector and after the last, for odd V or a misaligned tensor): its vectors go round the
// group's lanes, kRowPacks a lane per pass, all loaded before any is used; then its scalars. Each
// lane keeps a running max and sum of exp(x - max), which the group merges by shuffles. Every lane
// of a warp reaches the shuffles: rows past the end or outside the lengths take part with nothing.
template <class T, int kVec>
__global__ void __launch_bounds__(kThreads) loss_rows_group_kernel(LossArgs a, int lanes) {
  using Acc = acc_type<T>;
  const T* x = static_cast<const T*>(a.x);
  const Lattice& l = a.lattice;
  const int lane = static_cast<int>(threadIdx.x) % C10_WARP_SIZE, member = lane % lanes;
  const int64_t rows_per_warp = C10_WARP_SIZE / lanes, warps_per_block = blockDim.x / C10_WARP_SIZE;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / C10_WARP_SIZE;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps_per_block * rows_per_warp;
  for (int64_t first = warp * rows_per_warp; first < l.rows; first += step) {
    const int64_t row = first + lane / lanes;
    const Cell c = row < l.rows ? cell_of(l, row) : Cell{0, 0, 0, false};
    const T* logits = x + (c.valid ? row : 0) * a.classes;
    const RowSplit split = c.valid ? split_row<T, kVec>(logits, a.classes) : RowSplit{0, 0, kVec};
    const T* body = logits + split.head;
    // The blank's logit and the label's class, loaded by the lane that writes, alongside the vectors.
    float blank = 0.0f, label = 0.0f;
    int64_t label_class = 0;
    const bool labelled = has_label(l, c);
    if (member == 0 && c.valid) blank = static_cast<float>(logits[a.blank]);
    if (member == 0 && labelled) label_class = a.labels[c.b * a.label_stride + c.u];
    Acc max = kNegInf<Acc>, sum = Acc(0);
    for (int64_t p0 = 0; p0 < split.packs; p0 += static_cast<int64_t>(kRowPacks) * lanes) {
      AlignedVector<T, kVec> v[kRowPacks];
#pragma unroll
      for (int i = 0; i < kRowPacks; ++i) {
        const int64_t p = p0 + static_cast<int64_t>(i) * lanes + member;
        if (p < split.packs) v[i] = load_vector<kVec>(body, p * kVec);
      }
      // Vector by vector (only its kVec values converted at a time): raise the running max to the
      // vector's, rescaling the sum taken at the old one (rarely, after a row's first vectors; 0
      // while the old max was -inf), then add its exps.
#pragma unroll
      for (int i = 0; i < kRowPacks; ++i) {
        if (p0 + static_cast<int64_t>(i) * lanes + member >= split.packs) continue;
        Acc values[kVec];
        convert(v[i], values);
        Acc vector_max = kNegInf<Acc>;
#pragma unroll
        for (int e = 0; e < kVec; ++e) vector_max = max_of(vector_max, values[e]);
        if (vector_max > max) {
          sum *= fast_exp2((max - vector_max) * kLog2e<Acc>);
          max = vector_max;
        }
        const Acc base = max == kNegInf<Acc> ? Acc(0) : max * kLog2e<Acc>;  // -inf logits add exp2(-inf) = 0
#pragma unroll
        for (int e = 0; e < kVec; ++e) sum += fast_exp2(values[e] * kLog2e<Acc> - base);
      }
    }
    // The head and tail scalars (fewer than kVec each), round the group's lanes.
    const int64_t scalars = c.valid ? split.head + (a.classes - split.tail()) : 0;
    for (int64_t q = member; q < scalars; q += lanes) {
      const Acc value = static_cast<Acc>(logits[q < split.head ? q : split.tail() + (q - split.head)]);
      if (value > max) {
        sum *= fast_exp2((max - value) * kLog2e<Acc>);
        max = value;
      }
      sum += fast_exp2(value * kLog2e<Acc> - (max == kNegInf<Acc> ? Acc(0) : max * kLog2e<Acc>));
    }
    if (member == 0 && labelled) label = static_cast<float>(logits[label_class]);  // an L1 hit: the row was just read
    const Acc row_max = group_reduce(max, lanes, [](Acc p, Acc q) { return max_of(p, q); });
    // Each lane's sum at the row's max (equal maxima, -inf ones included, need no exp).
    if (max != row_max) sum *= fast_exp2((max - row_max) * kLog2e<Acc>);
    const Acc row_sum = group_reduce(sum, lanes, [](Acc p, Acc q) { return p + q; });
    if (member == 0 && row < l.rows) {
      write_row_terms<T>(a, c.valid, labelled, row, static_cast<float>(row_max + log(row_sum)), blank, label);
    }
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads) loss_rows_kernel(LossArgs a) {
  __shared__ Online<acc_type<T>> scratch[kMaxRowThreads / C10_WARP_SIZE];
  const T* x = static_cast<const T*>(a.x);
  const Lattice& l = a.lattice;
  for (int64_t row = blockIdx.x; row < l.rows; row += gridDim.x) {
    const Cell c = cell_of(l, row);
    if (!c.valid) {  // block-uniform: the row is never read
      if (threadIdx.x == 0) write_row_terms<T>(a, false, false, row, 0.0f, 0.0f, 0.0f);
      continue;
    }
    const T* logits = x + row * a.classes;
    const Online<acc_type<T>> state = row_statistics<kRowUnroll, kVec>(logits, a.classes, scratch);
    if (threadIdx.x == 0) {
      const bool labelled = has_label(l, c);
      const float label = labelled ? static_cast<float>(logits[a.labels[c.b * a.label_stride + c.u]]) : 0.0f;
      write_row_terms<T>(a, true, labelled, row, static_cast<float>(state.log_sum_exp()),
                         static_cast<float>(logits[a.blank]), label);
    }
  }
}

// alpha or beta of batch b by global memory alone, any u_len (blockDim.x threads over each diagonal).
C10_DEVICE void wavefront_any(const LossArgs& a, int64_t b, bool forward, float* values) {
  const Lattice& l = a.lattice;
  const int64_t t_len = l.t_len[b], u_len = l.u_len[b];
  for (int64_t step = 0; step < t_len + u_len - 1; ++step) {
    const int64_t d = forward ? step : t_len + u_len - 2 - step;
    for (int64_t u = threadIdx.x; u < u_len; u += blockDim.x) {
      const int64_t t = d - u;
      if (t < 0 || t >= t_len) continue;
      values[t * l.max_u + u] = forward ? alpha_at(a, b, t, u) : beta_at(a, b, t, u);
    }
    __syncthreads();  // the next diagonal reads this one
  }
}

// Diagonals ahead whose log-probabilities a wavefront thread holds (loads in flight meanwhile).
constexpr int kAhead = 3;

// alpha (blockIdx.y == 0) or beta (1) of batch blockIdx.x, over anti-diagonals t + u = d; the beta
// block also writes the loss. With u_len <= blockDim.x (the launch covers max_u up to
// kMaxWavefrontThreads), thread u owns the cell (d - u, u) of every diagonal: its own previous value
// stays in a register, its neighbour's (u - 1 for alpha, u + 1 for beta) comes from the previous
// diagonal in shared memory, and the two log-probabilities a cell adds are loaded kAhead diagonals
// early. No global load waits inside the recursion; alpha and beta are written as they go.
template <class T>
__global__ void __launch_bounds__(kMaxWavefrontThreads) wavefront_kernel(LossArgs a) {
  __shared__ float diagonal[2][kMaxWavefrontThreads];
  const Lattice& l = a.lattice;
  const int64_t b = blockIdx.x, t_len = l.t_len[b], u_len = l.u_len[b];
  const bool forward = blockIdx.y == 0;
  float* values = (forward ? a.alpha : a.beta) + b * l.max_t * l.max_u;
  if (u_len > static_cast<int64_t>(blockDim.x)) {  // block-uniform
    wavefront_any(a, b, forward, values);
    if (!forward && threadIdx.x == 0) static_cast<T*>(a.loss)[b] = static_cast<T>(t_len > 0 ? -values[0] : 0.0f);
    return;
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t u = threadIdx.x, steps = t_len + u_len - 1;
  const bool packed = l.batch_offset != nullptr;
  // Row (t, u) of batch b is first + t * per_t + u (row_of).
  const int64_t first = packed ? batch_start(l, b) : b * l.max_t * l.max_u, per_t = packed ? u_len : l.max_u;
  // The log-probabilities the cell of step s adds: alpha(t, u), t = s - u: blank of (t - 1, u) and
  // label of (t, u - 1); beta(t, u), t = steps - 1 - s - u: blank and label of (t, u).
  const auto fetch = [&](int64_t s, float& blank, float& label) {
    const int64_t t = (forward ? s : steps - 1 - s) - u;
    if (s >= steps || u >= u_len || t < 0 || t >= t_len) return;
    if (forward) {
      if (t > 0) blank = a.blank_logp[first + (t - 1) * per_t + u];
      if (u > 0) label = a.label_logp[first + t * per_t + u - 1];
    } else {
      blank = a.blank_logp[first + t * per_t + u];
      if (u + 1 < u_len) label = a.label_logp[first + t * per_t + u];
    }
  };
  float blank[kAhead + 1] = {}, label[kAhead + 1] = {};  // [i]: step s + i's
#pragma unroll
  for (int i = 0; i < kAhead; ++i) fetch(i, blank[i], label[i]);
  float mine = neg_inf;  // this thread's value on the previous diagonal
  for (int64_t s = 0; s < steps; ++s) {
    fetch(s + kAhead, blank[kAhead], label[kAhead]);
    const int64_t t = (forward ? s : steps - 1 - s) - u;
    if (u < u_len && t >= 0 && t < t_len) {
      const float* previous = diagonal[(s + 1) & 1];
      float value;
      if (forward) {
        value = t == 0 && u == 0 ? 0.0f
                                 : log_add_exp(t > 0 ? mine + blank[0] : neg_inf,
                                                    u > 0 ? previous[u - 1] + label[0] : neg_inf);
      } else {
        value = t == t_len - 1 && u == u_len - 1
                    ? blank[0]
                    : log_add_exp(t + 1 < t_len ? mine + blank[0] : neg_inf,
                                       u + 1 < u_len ? previous[u + 1] + label[0] : neg_inf);
      }
      mine = value;
      diagonal[s & 1][u] = value;
      values[t * l.max_u + u] = value;
    }
#pragma unroll
    for (int i = 0; i < kAhead; ++i) blank[i] = blank[i + 1], label[i] = label[i + 1];
    __syncthreads();  // the next diagonal reads this one; the one before is read by no one now
  }
  if (!forward && threadIdx.x == 0) {  // thread 0 computed beta(0, 0) last
    static_cast<T*>(a.loss)[b] = static_cast<T>(t_len > 0 && u_len > 0 ? -mine : 0.0f);
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads) loss_grad_kernel(LossBackwardArgs args) {
  const LossArgs& a = args.forward;
  const T* x = static_cast<const T*>(a.x);
  T* grad = static_cast<T*>(args.grad);
  const Lattice& l = a.lattice;
  for (int64_t row = blockIdx.x; row < l.rows; row += gridDim.x) {
    const Cell c = cell_of(l, row);
    T* out = grad + row * a.classes;
    if (!c.valid) {
      zero_row<kVec>(out, a.classes);
      continue;
    }
    const T* logits = x + row * a.classes;
    const float g = args.grad_loss[c.b];
    const CellGrad terms = cell_grad(a, c.b, c.t, c.u);
    const float scale = args.fused_softmax ? g * terms.occupancy : 0.0f;
    const float lse = a.lse[row];
    const RowSplit split = write_scaled_softmax<kRowUnroll, kVec>(logits, out, a.classes, lse, scale, 0.0f);
    // The blank's and the label's elements, rewritten by the threads that wrote them.
    const int64_t label = c.u + 1 < l.u_len[c.b] ? a.labels[c.b * a.label_stride + c.u] : -1;
    for (const int64_t v : {a.blank, label}) {
      if (v < 0 || threadIdx.x != split.owner(v) || (v == label && label == a.blank)) continue;
      const float p = expf(static_cast<float>(logits[v]) - lse);
      const float through = (v == a.blank ? terms.through_blank : 0.0f) + (v == label ? terms.through_label : 0.0f);
      out[v] = static_cast<T>(scale * p - g * through);
    }
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, std::numeric_limits<int32_t>::max())));
}

}  // namespace

void joint_forward(const Cuda& device, const JointArgs& a) {
  const Lattice& l = a.lattice;
  if (l.rows == 0 || a.width == 0) return;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_vector_width<T>(a.width, {a.f, a.g, a.h, a.keep, a.mask}, [&](auto width) {
      constexpr int kVec = decltype(width)::value;
      const BlockTile tile = block_tile(a.width / kVec, kThreads);
      const int threads = whole_warps(tile.cols * tile.rows);
      ForwardItems items{(l.max_t + tile.rows - 1) / tile.rows, 1, std::max<int64_t>(l.max_u, 1)};
      items.spans = (items.span + kForwardItemSteps - 1) / kForwardItemSteps;
      items.span = (items.span + items.spans - 1) / items.spans;  // even spans: 51 steps as 13, 13, 13, 12
      const auto kernel = joint_forward_kernel<T, kVec>;
      const int64_t resident = static_cast<int64_t>(sm_count(device.device)) *
                               resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, 0, device.device);
      const auto blocks = static_cast<unsigned>(
          std::max<int64_t>(1, std::min(l.batch * items.groups * items.spans, resident)));
      kernel<<<blocks, threads, 0, cuda::stream(device)>>>(a, tile, items);
    });
  });
  check_launch("transducer_joint_forward");
}

namespace {

// The backward kernel for a's gate: ReLU recomputed from f and g, or the mask (if any).
template <class T, int kVec>
auto backward_kernel(const JointBackwardArgs& a) {
  if constexpr (kVec == 1) {
    return joint_backward_kernel<T, kVec, Gate::kAny>;
  } else {
    return a.mask == nullptr && a.f != nullptr ? joint_backward_kernel<T, kVec, Gate::kRelu>
                                               : joint_backward_kernel<T, kVec, Gate::kMask>;
  }
}

template <class T, int kVec>
BackwardPlan backward_plan(const JointBackwardArgs& a, const Cuda& device) {
  const Lattice& l = a.lattice;
  const int64_t packs = a.width / kVec;
  BackwardPlan plan{};
  plan.packs = static_cast<int>(std::min<int64_t>(packs, kMaxChunkPacks));
  plan.lanes = kThreads / plan.packs;
  plan.chunks = (packs + plan.packs - 1) / plan.packs;
  // As few splits of the frames as cover them at kFramesPerLane frames a lane, more while the
  // blocks fill one wave of the GPU (down to a frame a lane): the partial sums cost 4 bytes per
  // g_grad value and split, next to 2 x frames / splits bytes of h_grad read per value.
  const int64_t fewest = std::max<int64_t>(1, (l.max_t + plan.lanes * kFramesPerLane - 1) / (plan.lanes * kFramesPerLane));
  const int64_t most = std::max<int64_t>(fewest, (l.max_t + plan.lanes - 1) / plan.lanes);
  // Planned on the mask's kernel whatever the gate, so that a recomputed ReLU sums in the same order
  // (same splits) as its stored mask: the same gradients, bit for bit.
  const auto plan_kernel = joint_backward_kernel<T, kVec, kVec == 1 ? Gate::kAny : Gate::kMask>;
  const int64_t resident = static_cast<int64_t>(sm_count(device.device)) *
                           resident_blocks_per_sm(reinterpret_cast<const void*>(plan_kernel),
                                                  kThreads, 0, device.device);
  const int64_t wanted = std::clamp<int64_t>(resident / std::max<int64_t>(1, l.batch * plan.chunks), fewest, most);
  plan.frames = std::max<int64_t>(1, (l.max_t + wanted - 1) / wanted);
  plan.splits = std::max<int64_t>(1, (l.max_t + plan.frames - 1) / plan.frames);
  plan.blocks = static_cast<unsigned>(l.batch * plan.chunks * plan.splits);
  return plan;
}

// The backward's plan for a's dtype and vector width.
template <class F>
auto with_backward_plan(const JointBackwardArgs& a, const Cuda& device, F&& f) {
  return dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = vector_width<T>();
    const bool wide = a.width % kWide == 0 && is_aligned(a.h_grad) && is_aligned(a.f_grad) && is_aligned(a.g_grad) &&
                      (a.mask == nullptr || is_aligned(a.mask)) && (a.f == nullptr || is_aligned(a.f)) &&
                      (a.g == nullptr || is_aligned(a.g));
    return wide ? f(tag, std::integral_constant<int, kWide>{}, backward_plan<T, kWide>(a, device))
                : f(tag, std::integral_constant<int, 1>{}, backward_plan<T, 1>(a, device));
  });
}

}  // namespace

int64_t joint_backward_workspace(const Cuda& device, const JointBackwardArgs& a) {
  const Lattice& l = a.lattice;
  if (l.batch == 0 || a.width == 0) return 0;
  return with_backward_plan(a, device, [&](auto, auto, const BackwardPlan& plan) -> int64_t {
    return plan.splits > 1 ? plan.splits * l.batch * l.max_u * a.width : 0;
  });
}

void joint_backward(const Cuda& device, const JointBackwardArgs& a) {
  const Lattice& l = a.lattice;
  if (l.batch == 0 || a.width == 0) return;
  with_backward_plan(a, device, [&](auto tag, auto width, const BackwardPlan& plan) {
    using T = typename decltype(tag)::type;
    const cudaStream_t stream = cuda::stream(device);
    JointBackwardArgs args = a;
    if (plan.splits == 1) args.workspace = nullptr;
    backward_kernel<T, decltype(width)::value>(a)<<<plan.blocks, kThreads, 0, stream>>>(args, plan);
    if (plan.splits > 1 && l.max_u > 0) {
      const auto blocks = static_cast<unsigned>(std::min<int64_t>(l.batch * l.max_u, std::numeric_limits<int32_t>::max()));
      joint_g_finish_kernel<T><<<blocks, kThreads, 0, stream>>>(args, plan.splits);
    }
  });
  check_launch("transducer_joint_backward");
}

void loss_forward(const Cuda& device, const LossArgs& a) {
  const Lattice& l = a.lattice;
  if (l.batch == 0) return;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const cudaStream_t stream = cuda::stream(device);
    if (l.rows > 0 && a.classes > 0 && a.classes * static_cast<int64_t>(sizeof(T)) <= kMaxGroupRowBytes) {
      // Any alignment: a row's misaligned ends are its scalars.
      constexpr int kVec = vector_width<T>();
      const int lanes = row_group_lanes(a.classes, kVec);
      const auto kernel = loss_rows_group_kernel<T, kVec>;
      const int64_t rows_per_block = kThreads / lanes;
      const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, 0, device.device);
      const int64_t resident = static_cast<int64_t>(sm_count(device.device)) * per_sm;  // one wave, rows in a loop
      const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((l.rows + rows_per_block - 1) / rows_per_block, 1,
                                                                    std::max<int64_t>(resident, 1)));
      kernel<<<blocks, kThreads, 0, stream>>>(a, lanes);
    } else if (l.rows > 0 && a.classes > 0) {  // any alignment too (row_statistics' RowSplit)
      const unsigned threads = row_threads<T>(a.classes, kRowUnroll, kMinRowThreads, kMaxRowThreads);
      loss_rows_kernel<T, vector_width<T>()><<<row_blocks(l.rows), threads, 0, stream>>>(a);
    }
    // A thread per u of a diagonal, in whole wavefronts (64 covers CUDA warps and ROCm wavefronts);
    // max_u past kMaxWavefrontThreads loops over u (wavefront_any).
    constexpr int64_t kLanes = 64;
    const unsigned threads = static_cast<unsigned>(
        std::min<int64_t>(kMaxWavefrontThreads, std::max<int64_t>(kLanes, (l.max_u + kLanes - 1) / kLanes * kLanes)));
    wavefront_kernel<T><<<dim3(static_cast<unsigned>(l.batch), 2), threads, 0, stream>>>(a);
  });
  check_launch("transducer_loss_forward");
}

void loss_backward(const Cuda& device, const LossBackwardArgs& args) {
  const LossArgs& a = args.forward;
  if (a.lattice.rows == 0 || a.classes == 0) return;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const unsigned threads = row_threads<T>(a.classes, kRowUnroll, kMinRowThreads, kMaxRowThreads);
    with_vector_width<T>(a.classes, {a.x, args.grad}, [&](auto width) {
      loss_grad_kernel<T, decltype(width)::value>
          <<<row_blocks(a.lattice.rows), threads, 0, cuda::stream(device)>>>(args);
    });
  });
  check_launch("transducer_loss_backward");
}

}  // namespace apex::transducer
