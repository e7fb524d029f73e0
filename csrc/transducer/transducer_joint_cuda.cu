// transducer: the joint's CUDA kernels (forward, backward) and their launches; the plan is in
// transducer_cuda.cuh.
#include "transducer_cuda.cuh"

namespace apex::transducer {
namespace {

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

}  // namespace apex::transducer
