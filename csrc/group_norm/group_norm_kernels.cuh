// group_norm: the CUDA kernels and their launches, as templates. forward_as<T> and backward_as<T> are
// compiled in units of their own, a direction and two dtypes each (group_norm_{forward,backward}_*.cu),
// which ninja builds in parallel: in one unit the 64 kernels took 24 s of one core (issue 11: each
// op's build within 20 s on the 16-core build host). group_norm_cuda.cu holds the entry points and
// sees the instances through the `extern template` declarations at the end of this file.
//
// Each direction is two launches over one-wave grids, and nothing else (no memset, no counters):
//   sums:  each block reads its tile (one sample, one split of the spatial axis, one chunk of
//          channels) once and writes one pair of sums per group its chunk touches; the backward's
//          blocks also write per-channel sums, for grad_weight and grad_bias;
//   apply: each block first folds the sums of the groups its chunk touches (splits x chunks pairs
//          a group, read in parallel by teams of lanes) into per-group coefficients, then re-reads
//          its tile and writes the output. It walks the tiles in reverse order: the tiles the sums
//          launch read last are still in L2. The backward's apply blocks also fold the per-channel
//          sums into grad_weight / grad_bias.
// No block waits for another and no fold is a serial tail: the old design folded splits x C pairs
// per sample in the last block to finish (16x1280x16x16: 500 KB through one block, most of the
// forward's time).
// Forward:  sums of (x - shift) and its square, shift = the group's first element (so the sum of
//           squares never cancels catastrophically); per channel a = rstd w, b = bias - mean a;
//           y = act(a x + b). The apply blocks of split 0 write mean and rstd.
// Backward: per-group sums of w dz and w dz xhat (dz = dy act'(z), each block weighting its channel
//           sums by w) give the group's B, D of dx = a dz + B x + D.
// Every sum is taken in a fixed order (rows, then channels, then splits and chunks in order, then a
// fixed butterfly of a team's lanes): results are deterministic.
//
// Tiles: a block is a cols x rows grid of threads (rounded up to whole warps; the extra threads
// only take part in the folds), each thread holding one pack of kVec elements (a 16-byte vector
// when the layout allows, else one element) and walking it along the spatial axis:
//   NHWC: a sample is [S, C]; thread (r, k) takes channel pack k of a chunk of channels (fixed for
//         good) at positions r, r + rows, ... of its split of S.
//   NCHW: a sample is [C, S]; thread (r, k) takes channel r of the block's channels, at packs
//         k, k + cols, ... of its split of S (every lane of a pack in the same channel).
#pragma once

#include "apex/acc_type.h"
#include "apex/block_reduce.cuh"
#include "apex/cuda.cuh"
#include "apex/dependent_launch.cuh"
#include "apex/fast_exp2.cuh"
#include "apex/occupancy.cuh"
#include "group_norm.h"
#include "group_norm_math.h"

#include <cstring>
#include <type_traits>

namespace apex::group_norm {
namespace {

// Threads per block (at most). Each kernel's grid is one wave: as many blocks as its occupancy
// keeps resident (a second, partial wave left SMs idle; more blocks also mean more sums to fold).
constexpr int kThreads = 256;
// NHWC: channel packs across a block, at most. 32 x 16 bytes keeps each row's loads 512 contiguous
// bytes, and chunks this narrow let a small spatial axis still fill the GPU with few splits.
constexpr int kMaxCols = 32;
// NCHW: threads along S per channel, so a channel's sum is a sum of this many threads'.
constexpr int kNchwLanes = 32;
// Partial sums a folding lane loads before adding any (the folds are latency chains otherwise).
constexpr int kFoldBatch = 8;
// Threads an SM holds at most (Hopper, Ampere; bounds the workspace's partial sums).
constexpr int kMaxThreadsPerSm = 2048;
// Per pass, two paths (each pass's kUnroll and kBlocks pick by kVec):
//   the 16-byte vector path (for_each_pack_pipelined): two batches of kUnroll packs in registers a
//     thread, the next batch's loads in flight while the current one is used; packs held as 32-bit
//     words (Held). Each batch as large as fits the pass's register budget without spilling (ptxas
//     -v, sm_90, 16-bit data: 80-96 registers). The forward sums take a budget of 3 blocks of
//     kThreads (80 registers): 5 blocks of the benchmark's 160 threads an SM where 2 blocks (128
//     registers) gave 3; the other passes spill at 80. H200, 16x320x64x64 bf16 NHWC: 1763 -> 1830
//     GB/s forward with the pipelined walk and this budget (session 30);
//   the width-1 path (for_each_pack: unaligned data, or C / S not a multiple of the vector): kUnroll
//     packs loaded, then all used, then the next kUnroll, at 2 blocks of kThreads (128 registers).
constexpr int kForwardSumsVectorUnroll = 4, kForwardSumsVectorBlocks = 3;
constexpr int kForwardApplyVectorUnroll = 4, kForwardApplyVectorBlocks = 2;
constexpr int kBackwardSumsVectorUnroll = 1, kBackwardSumsVectorBlocks = 2;
constexpr int kBackwardApplyVectorUnroll = 2, kBackwardApplyVectorBlocks = 2;
constexpr int kForwardSumsScalarUnroll = 8, kForwardApplyScalarUnroll = 6;
constexpr int kBackwardSumsScalarUnroll = 2, kBackwardApplyScalarUnroll = 2;
constexpr int kScalarBlocks = 2;
// Packs a thread takes at least in a split of the spatial axis (plan_for): two of the vector path's
// forward-sums batches, one of the width-1 path's.
constexpr int kMinSplitPacks = 8;
// The backward's per-channel sums (written by the sums pass, read by the apply pass) are kept
// under 1/kChannelSumsShare of x's bytes by capping its splits, unless that leaves SMs idle.
constexpr int kChannelSumsShare = 16;
// grad_weight / grad_bias fold: channels a warp takes at once (8 x 8-byte pairs: 64 contiguous
// bytes a load); its other lanes split the terms.
constexpr int kParamChannelLanes = 8;

// Which path a pack width takes: the 16-byte vector path, or the width-1 path.
template <int kVec>
constexpr bool kVectorPath = kVec > 1;

// The SiLU's sigmoid. kFast (the vector path, float accumulators: 16-bit and float32 data):
// apex/fast_exp2.cuh's ex2.approx.ftz + rcp.approx.ftz, two MUFU instructions where expf and an IEEE
// division take ~25 with a slow-path branch. Else (double, and the width-1 path, which was not
// measured with it) group_norm_math.h's, as the CPU path.
template <bool kFast, class Acc>
C10_DEVICE C10_ALWAYS_INLINE Acc sigmoid_for(Acc z) {
  if constexpr (kFast && std::is_same_v<Acc, float>) {
    return fast_sigmoid(z);
  } else {
    return sigmoid(z);
  }
}

template <bool kFast, class Acc>
C10_DEVICE C10_ALWAYS_INLINE Acc activate_for(Acc z, bool silu) {
  return silu ? z * sigmoid_for<kFast>(z) : z;
}

template <bool kFast, class Acc>
C10_DEVICE C10_ALWAYS_INLINE Acc slope_for(Acc z) {
  const Acc s = sigmoid_for<kFast>(z);
  return s * (Acc(1) + z * (Acc(1) - s));
}

// What a launch covers. Blocks are numbered sample-major: block b is sample b / blocks_per_sample,
// split (b % blocks_per_sample) / chunks, chunk (b % blocks_per_sample) % chunks.
struct Plan {
  int64_t samples, channels, groups, spatial, per_group;
  int cols, rows;             // the block's thread grid (see the file comment)
  int threads;                // cols * rows rounded up to whole warps
  int chunks;                 // chunks of channels a sample is cut into
  int64_t chunk_width;        // channels a chunk: NHWC cols * kVec, NCHW rows
  int slots;                  // groups a chunk touches, at most
  int splits;                 // parts of the spatial axis
  int64_t split_len;          // NHWC: positions per split; NCHW: packs per split
  int64_t blocks_per_sample;  // splits * chunks
  int sum_splits;             // the sums grid's splits: the layout of the partial sums
};

template <class Acc>
struct Pair {
  Acc a, b;
};

struct AddPairs {
  template <class Acc>
  C10_DEVICE C10_ALWAYS_INLINE Pair<Acc> operator()(const Pair<Acc>& x, const Pair<Acc>& y) const {
    return {x.a + y.a, x.b + y.b};
  }
};

template <class Acc>
struct Workspace {
  Pair<Acc>* group_sums;    // [N, sum_splits, chunks, slots]: slot s of chunk k is group k's first + s
  Pair<Acc>* channel_sums;  // [N, sum_splits, C]: backward only
};

C10_HOST_DEVICE constexpr int64_t align_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The workspace's arrays, each on a 256-byte boundary, in the order of the struct; `base` null
// only measures (the end pointer is then the byte count).
template <class Acc>
C10_HOST_DEVICE Workspace<Acc> carve(void* base, const Plan& p, int64_t* bytes = nullptr) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(base);
  const int64_t partials = p.samples * p.sum_splits;
  int64_t at = 0;
  Workspace<Acc> ws;
  ws.group_sums = reinterpret_cast<Pair<Acc>*>(start + at);
  at += align_up(sizeof(Pair<Acc>) * partials * p.chunks * p.slots);
  ws.channel_sums = reinterpret_cast<Pair<Acc>*>(start + at);
  at += align_up(sizeof(Pair<Acc>) * partials * p.channels);
  if (bytes != nullptr) *bytes = at;
  return ws;
}

template <class Acc>
int64_t carved_bytes(const Plan& p) {
  int64_t bytes = 0;
  carve<Acc>(nullptr, p, &bytes);
  return bytes;
}

// The first group chunk `chunk` touches; its slot s holds group first_group + s.
C10_HOST_DEVICE inline int64_t first_group(const Plan& p, int64_t chunk) {
  return chunk * p.chunk_width / p.per_group;
}

// Element offset of x[n, c, spatial 0] (the shift of c's group when c is its first channel).
C10_DEVICE inline int64_t offset_of(const Plan& p, Layout layout, int64_t n, int64_t c) {
  return layout == Layout::kNhwc ? n * p.spatial * p.channels + c : (n * p.channels + c) * p.spatial;
}

// ---- where a thread works -------------------------------------------------------------------

// A block's tile: its sample, split of the spatial axis and chunk of channels.
struct Place {
  int64_t sample, split, chunk;
};

// A thread's packs: `count` of them at element offsets first + j * stride, lane k of each in
// channel channel[k] (the same channel for every pack).
template <int kVec>
struct Walk : Place {
  int64_t first, stride;
  int count;
  int64_t channel[kVec];
};

template <Layout kLayout, int kVec>
C10_DEVICE Walk<kVec> walk_of(const Plan& p, int64_t block) {
  Walk<kVec> w;
  w.sample = block / p.blocks_per_sample;
  const int64_t block_in_sample = block - w.sample * p.blocks_per_sample;
  w.split = block_in_sample / p.chunks;
  w.chunk = block_in_sample - w.split * p.chunks;
  const int r = static_cast<int>(threadIdx.x) / p.cols, k = static_cast<int>(threadIdx.x) % p.cols;
  const bool in_tile = r < p.rows;  // not one of the threads that round the block up to whole warps
  if constexpr (kLayout == Layout::kNhwc) {
    const int64_t pack = w.chunk * p.cols + k;
    const int64_t begin = w.split * p.split_len + r, end = std::min(p.spatial, (w.split + 1) * p.split_len);
    const bool valid = in_tile && pack * kVec < p.channels && begin < end;
    w.count = valid ? static_cast<int>((end - begin + p.rows - 1) / p.rows) : 0;
    w.first = (w.sample * p.spatial + begin) * p.channels + pack * kVec;
    w.stride = static_cast<int64_t>(p.rows) * p.channels;
#pragma unroll
    for (int l = 0; l < kVec; ++l) w.channel[l] = pack * kVec + l;
  } else {
    const int64_t channel = w.chunk * p.rows + r, packs = p.spatial / kVec;
    const int64_t begin = w.split * p.split_len + k, end = std::min(packs, (w.split + 1) * p.split_len);
    const bool valid = in_tile && channel < p.channels && begin < end;
    w.count = valid ? static_cast<int>((end - begin + p.cols - 1) / p.cols) : 0;
    w.first = (w.sample * p.channels + channel) * p.spatial + begin * kVec;
    w.stride = static_cast<int64_t>(p.cols) * kVec;
#pragma unroll
    for (int l = 0; l < kVec; ++l) w.channel[l] = channel;
  }
  return w;
}

// ---- what a pass does at each element ----------------------------------------------------------

// Each pass: `prepare` reads its per-lane coefficients once (the apply passes from `slot_table`,
// their block's per-group values), `visit` / `value` handles lane l of a pack. (Loading the apply
// passes' weights before their fold measured slower on an H200, as did issuing the first packs'
// loads before it.)

// Forward sums: (x - shift, its square), shift = the first element of the lane's group; a group's
// sums are its channels' sums as they are.
template <class T, int kVec, Layout kLayout>
struct ForwardSums {
  using Acc = acc_type<T>;
  static constexpr bool kReadsDy = false;
  static constexpr bool kChannelSums = false;
  static constexpr int kUnroll = kVectorPath<kVec> ? kForwardSumsVectorUnroll : kForwardSumsScalarUnroll;
  static constexpr int kBlocks = kVectorPath<kVec> ? kForwardSumsVectorBlocks : kScalarBlocks;
  Acc shift[kVec];

  C10_DEVICE void prepare(const ForwardArgs& args, const Plan& p, const Pair<Acc>*, const Walk<kVec>& w) {
    const T* x = static_cast<const T*>(args.x);
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      const int64_t first_channel = std::min(w.channel[l], p.channels - 1) / p.per_group * p.per_group;
      shift[l] = static_cast<Acc>(x[offset_of(p, kLayout, w.sample, first_channel)]);
    }
  }

  template <bool>
  C10_DEVICE C10_ALWAYS_INLINE void visit(int l, Acc x, Acc, Pair<Acc>& sum) const {
    const Acc d = x - shift[l];
    sum.a += d;
    sum.b += d * d;
  }

  C10_DEVICE static Acc group_weight(const ForwardArgs&, int64_t) { return Acc(1); }
};

// Backward sums: (dz, dz * xhat); a group's sums weight its channels' by w.
template <class T, int kVec>
struct BackwardSums {
  using Acc = acc_type<T>;
  static constexpr bool kReadsDy = true;
  static constexpr bool kChannelSums = true;
  static constexpr int kUnroll = kVectorPath<kVec> ? kBackwardSumsVectorUnroll : kBackwardSumsScalarUnroll;
  static constexpr int kBlocks = kVectorPath<kVec> ? kBackwardSumsVectorBlocks : kScalarBlocks;
  Acc scale[kVec], offset[kVec];  // xhat = scale x + offset
  Acc weight[kVec], bias[kVec];   // z = weight xhat + bias (SiLU only)
  bool silu;

  C10_DEVICE void prepare(const BackwardArgs& args, const Plan& p, const Pair<Acc>*, const Walk<kVec>& w) {
    silu = args.silu;
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      const int64_t c = std::min(w.channel[l], p.channels - 1), gid = w.sample * p.groups + c / p.per_group;
      const Acc rstd = static_cast<const Acc*>(args.rstd)[gid], mean = static_cast<const Acc*>(args.mean)[gid];
      scale[l] = rstd;
      offset[l] = -mean * rstd;
      weight[l] = group_weight(args, c);
      bias[l] = args.bias != nullptr ? static_cast<const Acc*>(args.bias)[c] : Acc(0);
    }
  }

  template <bool kFast>
  C10_DEVICE C10_ALWAYS_INLINE void visit(int l, Acc x, Acc dy, Pair<Acc>& sum) const {
    const Acc xhat = x * scale[l] + offset[l];
    const Acc dz = silu ? dy * slope_for<kFast>(xhat * weight[l] + bias[l]) : dy;
    sum.a += dz;
    sum.b += dz * xhat;
  }

  C10_DEVICE static Acc group_weight(const BackwardArgs& args, int64_t c) {
    return args.weight != nullptr ? static_cast<const Acc*>(args.weight)[c] : Acc(1);
  }
};

// Forward output: y = act(a x + b); slot_table holds the block's groups' (mean, rstd).
template <class T, int kVec>
struct ForwardApply {
  using Acc = acc_type<T>;
  static constexpr bool kReadsDy = false;
  static constexpr int kUnroll = kVectorPath<kVec> ? kForwardApplyVectorUnroll : kForwardApplyScalarUnroll;
  static constexpr int kBlocks = kVectorPath<kVec> ? kForwardApplyVectorBlocks : kScalarBlocks;
  Acc a[kVec], b[kVec];
  bool silu;

  C10_DEVICE void prepare(const ForwardArgs& args, const Plan& p, const Pair<Acc>* slot_table, const Walk<kVec>& w) {
    silu = args.silu;
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      const int64_t c = std::min(w.channel[l], p.channels - 1);
      const Pair<Acc> stats = slot_table[c / p.per_group - first_group(p, w.chunk)];
      const Acc weight = args.weight != nullptr ? static_cast<const Acc*>(args.weight)[c] : Acc(1);
      const Acc bias = args.bias != nullptr ? static_cast<const Acc*>(args.bias)[c] : Acc(0);
      a[l] = stats.b * weight;
      b[l] = bias - stats.a * a[l];
    }
  }

  template <bool kFast>
  C10_DEVICE C10_ALWAYS_INLINE Acc value(int l, Acc x, Acc) const { return activate_for<kFast>(x * a[l] + b[l], silu); }
};

// Backward output: dx = a dz + B x + D, dz = dy act'(a x + b); slot_table holds the groups' (B, D).
template <class T, int kVec>
struct BackwardApply {
  using Acc = acc_type<T>;
  static constexpr bool kReadsDy = true;
  static constexpr int kUnroll = kVectorPath<kVec> ? kBackwardApplyVectorUnroll : kBackwardApplyScalarUnroll;
  static constexpr int kBlocks = kVectorPath<kVec> ? kBackwardApplyVectorBlocks : kScalarBlocks;
  Acc a[kVec], b[kVec], B[kVec], D[kVec];
  bool silu;

  C10_DEVICE void prepare(const BackwardArgs& args, const Plan& p, const Pair<Acc>* slot_table, const Walk<kVec>& w) {
    silu = args.silu;
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      const int64_t c = std::min(w.channel[l], p.channels - 1), gid = w.sample * p.groups + c / p.per_group;
      const Acc rstd = static_cast<const Acc*>(args.rstd)[gid], mean = static_cast<const Acc*>(args.mean)[gid];
      const Acc weight = args.weight != nullptr ? static_cast<const Acc*>(args.weight)[c] : Acc(1);
      const Acc bias = args.bias != nullptr ? static_cast<const Acc*>(args.bias)[c] : Acc(0);
      const Pair<Acc> bd = slot_table[c / p.per_group - first_group(p, w.chunk)];
      a[l] = rstd * weight;
      b[l] = bias - mean * a[l];
      B[l] = bd.a;
      D[l] = bd.b;
    }
  }

  template <bool kFast>
  C10_DEVICE C10_ALWAYS_INLINE Acc value(int l, Acc x, Acc dy) const {
    const Acc dz = silu ? dy * slope_for<kFast>(x * a[l] + b[l]) : dy;
    return a[l] * dz + B[l] * x + D[l];
  }
};

// ---- the walk ------------------------------------------------------------------------------------

// The width-1 path's walk: calls f(element offset, x pack, dy pack) for each of the thread's packs,
// kUnroll packs' loads ahead (all loaded, then all used).
template <class T, int kVec, int kUnroll, bool kReadsDy, class F>
C10_DEVICE C10_ALWAYS_INLINE void for_each_pack(const Walk<kVec>& w, const T* x, const T* dy, F&& f) {
  using Pack = AlignedVector<T, kVec>;
  for (int j = 0; j < w.count; j += kUnroll) {
    Pack xs[kUnroll], dys[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j + u < w.count) {
        const int64_t at = w.first + (j + u) * w.stride;
        xs[u] = load_vector<kVec>(x, at);
        if constexpr (kReadsDy) dys[u] = load_vector<kVec>(dy, at);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j + u < w.count) f(w.first + (j + u) * w.stride, xs[u], dys[u]);
    }
  }
}

// A pipelined batch holds 16-byte packs as four 32-bit words, turned into T only where they are used:
// held as AlignedVector<c10::BFloat16, 8>, nvcc moved each element into a register of its own right
// after the load (8 registers a pack, not 4), which spilled the bf16 kernels.
template <class Pack>
using Held = std::conditional_t<sizeof(Pack) == 16, uint4, Pack>;

// A pack, evict-first (ld.global.cs) where it is read for the last time (kLast: the apply passes),
// so that it does not push out of L2 the tiles the apply pass still has to re-read.
template <bool kLast, class Pack, class T>
C10_DEVICE C10_ALWAYS_INLINE Held<Pack> load_held(const T* base, int64_t offset) {
  const Held<Pack>* at = reinterpret_cast<const Held<Pack>*>(base + offset);
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  if constexpr (kLast && sizeof(Pack) == 16) return __ldcs(at);
#endif
  return *at;
}

template <class Pack>
C10_DEVICE C10_ALWAYS_INLINE Pack unheld(const Held<Pack>& held) {
  Pack pack;
  memcpy(&pack, &held, sizeof(pack));
  return pack;
}

// The output pack: on the vector path evict-first (st.global.cs, one 16-byte store as
// store_vector's), since nothing here reads it again and in L2 it would evict x's tiles that the
// apply pass still re-reads (the sums pass left them there); else store_vector. These hints and the
// fast sigmoid (sigmoid_for) took 16x320x64x64 bf16 NHWC on an H200 from 1830 to 2008 GB/s forward
// and 1673 to 1788 GB/s forward + backward (session 30).
template <int kVec, class T>
C10_DEVICE C10_ALWAYS_INLINE void store_pack(T* base, int64_t offset, const AlignedVector<T, kVec>& pack) {
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  if constexpr (sizeof(pack) == 16) {
    uint4 bits;
    memcpy(&bits, &pack, sizeof(bits));
    __stcs(reinterpret_cast<uint4*>(base + offset), bits);
    return;
  }
#endif
  store_vector<kVec>(base, offset, pack);
}

// The vector path's walk: for_each_pack's calls, software-pipelined. Two batches of kUnroll packs in
// registers, the loads of one issued before the other is used, so the thread never waits with no
// load in flight (load-all-then-use-all leaves DRAM idle while it adds: that walk's forward sums
// stalled on long_scoreboard 46% of the time, at 49% of DRAM bandwidth). Offsets step by the stride
// from the walk's first. (Loading and using a batch the thread has whole without a check per pack
// saved ~4 of ~49 SASS instructions a bf16 pack and measured no faster on an H200: session 30.)
template <class T, int kVec, int kUnroll, bool kReadsDy, bool kLast, class F>
C10_DEVICE C10_ALWAYS_INLINE void for_each_pack_pipelined(const Walk<kVec>& w, const T* x, const T* dy, F&& f) {
  using Pack = AlignedVector<T, kVec>;
  struct Batch {
    Held<Pack> xs[kUnroll], dys[kUnroll];
  };
  const int64_t batch_stride = kUnroll * w.stride;
  const auto load = [&](Batch& b, int j, int64_t at) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j + u < w.count) {
        b.xs[u] = load_held<kLast, Pack>(x, at);
        if constexpr (kReadsDy) b.dys[u] = load_held<kLast, Pack>(dy, at);
      }
      at += w.stride;
    }
  };
  const auto use = [&](const Batch& b, int j, int64_t at) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (j + u < w.count) f(at, unheld<Pack>(b.xs[u]), unheld<Pack>(b.dys[u]));
      at += w.stride;
    }
  };
  Batch even, odd;
  int64_t at = w.first;
  load(even, 0, at);
  for (int j = 0; j < w.count; j += 2 * kUnroll, at += 2 * batch_stride) {
    load(odd, j + kUnroll, at + batch_stride);
    use(even, j, at);
    if (j + kUnroll >= w.count) break;
    load(even, j + 2 * kUnroll, at + 2 * batch_stride);
    use(odd, j + kUnroll, at + batch_stride);
  }
}

// The thread's packs for Pass, by its path's walk (kLast: the data's last read, see load_held).
template <class Pass, bool kLast, class T, int kVec, class F>
C10_DEVICE C10_ALWAYS_INLINE void walk_packs(const Walk<kVec>& w, const T* x, const T* dy, F&& f) {
  if constexpr (kVectorPath<kVec>) {
    for_each_pack_pipelined<T, kVec, Pass::kUnroll, Pass::kReadsDy, kLast>(w, x, dy, f);
  } else {
    for_each_pack<T, kVec, Pass::kUnroll, Pass::kReadsDy>(w, x, dy, f);
  }
}

// ---- folds -----------------------------------------------------------------------------------------

// Lanes a team gives each of `items` items: the most (a power of two up to the warp) that lets one
// round of the block's teams cover them all, so a fold's latency is one or two batches of loads.
C10_DEVICE inline int team_size(int items) {
  int team = C10_WARP_SIZE;
  while (team > 1 && team * items > static_cast<int>(blockDim.x)) team /= 2;
  return team;
}

// The sum of load(t) for t = first, first + step, ... < count, added in that order, kFoldBatch
// loads in flight at a time (a fold is a chain of dependent latencies otherwise).
template <class Acc, class Load>
C10_DEVICE C10_ALWAYS_INLINE Pair<Acc> strided_sum(int64_t first, int64_t count, int64_t step, Load load) {
  Pair<Acc> sum{Acc(0), Acc(0)};
  for (; first < count; first += step * kFoldBatch) {
    Pair<Acc> batch[kFoldBatch];
#pragma unroll
    for (int i = 0; i < kFoldBatch; ++i) {
      if (first + i * step < count) batch[i] = load(first + i * step);
    }
#pragma unroll
    for (int i = 0; i < kFoldBatch; ++i) {
      if (first + i * step < count) sum = AddPairs{}(sum, batch[i]);
    }
  }
  return sum;
}

// For each item i < items, the sum of its terms(i) pairs term(i, t), added in a fixed order: lane j
// of the item's team adds terms j, j + team, ... (strided_sum), then the team's lanes
// are added by a fixed butterfly; done(i, sum) runs on the team's first lane. Every thread of the
// block calls it, the same number of rounds (the butterflies shuffle across whole warps).
template <class Acc, class Terms, class Term, class Done>
C10_DEVICE void team_fold(int items, Terms terms, Term term, Done done) {
  const int team = team_size(items), teams = static_cast<int>(blockDim.x) / team;
  const int me = static_cast<int>(threadIdx.x) / team, lane = static_cast<int>(threadIdx.x) % team;
  for (int round = 0; round < items; round += teams) {
    const int item = round + me;
    Pair<Acc> sum{Acc(0), Acc(0)};
    if (item < items) sum = strided_sum<Acc>(lane, terms(item), team, [&](int64_t t) { return term(item, t); });
    sum = cuda::group_reduce(sum, team, AddPairs{});
    if (item < items && lane == 0) done(item, sum);
  }
}

// The sums of each group chunk `chunk` of sample n touches, folded over the sums grid's splits and
// the chunks the group spans; done(slot, group, sum) on one lane each.
template <class Acc, class Done>
C10_DEVICE void fold_groups(const Plan& p, const Workspace<Acc>& ws, int64_t n, int64_t chunk, Done done) {
  const int64_t first = first_group(p, chunk);
  const int64_t last = (std::min(p.channels, (chunk + 1) * p.chunk_width) - 1) / p.per_group;
  const Pair<Acc>* sample_sums = ws.group_sums + n * p.sum_splits * p.chunks * p.slots;
  // group g's chunks: from the one holding its first channel to the one holding its last.
  const auto chunks_of = [&](int64_t g, int64_t* from) {
    *from = g * p.per_group / p.chunk_width;
    return ((g + 1) * p.per_group - 1) / p.chunk_width - *from + 1;
  };
  team_fold<Acc>(
      static_cast<int>(last - first + 1),
      [&](int slot) {
        int64_t from;
        return p.sum_splits * chunks_of(first + slot, &from);
      },
      [&](int slot, int64_t t) {
        int64_t from;
        const int64_t spanned = chunks_of(first + slot, &from);
        const int64_t split = t / spanned, k = from + t % spanned;
        return sample_sums[(split * p.chunks + k) * p.slots + (first + slot - first_group(p, k))];
      },
      [&](int slot, const Pair<Acc>& sum) { done(slot, first + slot, sum); });
}

// grad_weight[c] = sum of dz xhat, grad_bias[c] = sum of dz: channel c's sums over samples and splits,
// kParamChannelLanes channels a warp at once (its other lanes split the terms), warps across the grid.
template <class Acc>
C10_DEVICE void fold_param_grads(const BackwardArgs& args, const Plan& p, const Workspace<Acc>& ws) {
  if (args.grad_weight == nullptr && args.grad_bias == nullptr) return;
  constexpr int kTermLanes = C10_WARP_SIZE / kParamChannelLanes;
  const int64_t warps_per_block = blockDim.x / C10_WARP_SIZE;
  const int64_t warp = blockIdx.x * warps_per_block + threadIdx.x / C10_WARP_SIZE;
  const int64_t warps = gridDim.x * warps_per_block;
  const int lane = static_cast<int>(threadIdx.x) % C10_WARP_SIZE;
  const int channel_lane = lane % kParamChannelLanes, term_lane = lane / kParamChannelLanes;
  const int64_t terms = p.samples * p.sum_splits;
  for (int64_t base = warp * kParamChannelLanes; base < p.channels; base += warps * kParamChannelLanes) {
    const int64_t c = base + channel_lane;
    Pair<Acc> sum{Acc(0), Acc(0)};
    if (c < p.channels) {
      sum = strided_sum<Acc>(term_lane, terms, kTermLanes, [&](int64_t t) { return ws.channel_sums[t * p.channels + c]; });
    }
#pragma unroll
    for (int offset = C10_WARP_SIZE / 2; offset >= kParamChannelLanes; offset /= 2) {
      sum = AddPairs{}(sum, cuda::shuffle_xor(sum, offset));
    }
    if (term_lane == 0 && c < p.channels) {
      if (args.grad_weight != nullptr) static_cast<Acc*>(args.grad_weight)[c] = sum.b;
      if (args.grad_bias != nullptr) static_cast<Acc*>(args.grad_bias)[c] = sum.a;
    }
  }
}

// The apply passes' per-group values, one per slot of the block's chunk, into slot_table.
template <class T>
C10_DEVICE void group_coefficients(const ForwardArgs& args, const Plan& p, const Workspace<acc_type<T>>& ws,
                                   const Place& block, Pair<acc_type<T>>* slot_table) {
  using Acc = acc_type<T>;
  const Acc count = static_cast<Acc>(p.per_group * p.spatial);
  fold_groups(p, ws, block.sample, block.chunk, [&](int slot, int64_t g, const Pair<Acc>& sum) {
    const int64_t first_channel = g * p.per_group;
    const T* x = static_cast<const T*>(args.x);
    const Acc shift = static_cast<Acc>(x[offset_of(p, args.shape.layout, block.sample, first_channel)]);
    const Moments<Acc> m = moments(sum.a, sum.b, shift, count, args.eps);
    slot_table[slot] = {m.mean, m.rstd};
    // One block writes each group's statistics: split 0's, of the chunk holding its first channel.
    if (block.split == 0 && first_channel / p.chunk_width == block.chunk) {
      static_cast<Acc*>(args.mean)[block.sample * p.groups + g] = m.mean;
      static_cast<Acc*>(args.rstd)[block.sample * p.groups + g] = m.rstd;
    }
  });
}

template <class T>
C10_DEVICE void group_coefficients(const BackwardArgs& args, const Plan& p, const Workspace<acc_type<T>>& ws,
                                   const Place& block, Pair<acc_type<T>>* slot_table) {
  using Acc = acc_type<T>;
  fold_param_grads(args, p, ws);
  const Acc count = static_cast<Acc>(p.per_group * p.spatial);
  fold_groups(p, ws, block.sample, block.chunk, [&](int slot, int64_t g, const Pair<Acc>& sum) {
    // dx = rstd (w dz - mean(w dz) - xhat mean(w dz xhat)), xhat = (x - mean) rstd
    const int64_t gid = block.sample * p.groups + g;
    const Acc rstd = static_cast<const Acc*>(args.rstd)[gid], mean = static_cast<const Acc*>(args.mean)[gid];
    const Acc B = -rstd * rstd * (sum.b / count);
    slot_table[slot] = {B, -rstd * (sum.a / count) - B * mean};
  });
}

// ---- kernels ---------------------------------------------------------------------------------------

// The block's sums per group its chunk touches (and, for the backward, per channel).
template <class T, int kVec, Layout kLayout, class Pass, class Args>
__global__ void __launch_bounds__(kThreads, Pass::kBlocks) sums_kernel(Args args, Plan p) {
  using Acc = acc_type<T>;
  extern __shared__ unsigned char shared_bytes[];
  Pair<Acc>* lane_sums = reinterpret_cast<Pair<Acc>*>(shared_bytes);  // [threads * kVec]
  Pair<Acc>* chunk_sums = lane_sums + p.threads * kVec;               // [chunk_width]
  cuda::allow_dependent_launch();  // the apply pass's blocks may start as this grid's retire
  const Workspace<Acc> ws = carve<Acc>(args.workspace, p);
  const Walk<kVec> w = walk_of<kLayout, kVec>(p, blockIdx.x);
  Pass pass;
  Pair<Acc> sums[kVec];
#pragma unroll
  for (int l = 0; l < kVec; ++l) sums[l] = {Acc(0), Acc(0)};
  const T* dy = nullptr;
  if constexpr (Pass::kReadsDy) dy = static_cast<const T*>(args.dy);
  pass.prepare(args, p, nullptr, w);
  walk_packs<Pass, false>(w, static_cast<const T*>(args.x), dy, [&](int64_t, const auto& xs, const auto& dys) {
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      Acc d = Acc(0);
      if constexpr (Pass::kReadsDy) d = static_cast<Acc>(dys.value[l]);
      pass.template visit<kVectorPath<kVec>>(l, static_cast<Acc>(xs.value[l]), d, sums[l]);
    }
  });
  // Per channel of the chunk, in a fixed order: NHWC adds the rows of each (pack, lane) (row r's
  // lane sums sit at r * chunk_width + the channel's offset in the chunk), NCHW first the lanes of
  // a pack (one channel) and then the cols of its row.
  if constexpr (kLayout == Layout::kNhwc) {
#pragma unroll
    for (int l = 0; l < kVec; ++l) lane_sums[threadIdx.x * kVec + l] = sums[l];
  } else {
    Pair<Acc> s = sums[0];
#pragma unroll
    for (int l = 1; l < kVec; ++l) s = AddPairs{}(s, sums[l]);
    lane_sums[threadIdx.x] = s;
  }
  __syncthreads();
  const int64_t partial = w.sample * p.sum_splits + w.split;  // this block's (sample, split)
  for (int o = threadIdx.x; o < p.chunk_width; o += blockDim.x) {
    const int64_t c = w.chunk * p.chunk_width + o;
    Pair<Acc> s{Acc(0), Acc(0)};
    if (c < p.channels) {
      if constexpr (kLayout == Layout::kNhwc) {
        for (int r = 0; r < p.rows; ++r) s = AddPairs{}(s, lane_sums[r * p.chunk_width + o]);
      } else {
        for (int k = 0; k < p.cols; ++k) s = AddPairs{}(s, lane_sums[o * p.cols + k]);
      }
      if constexpr (Pass::kChannelSums) ws.channel_sums[partial * p.channels + c] = s;
      const Acc weight = Pass::group_weight(args, c);
      s.a *= weight;
      s.b *= weight;
    }
    chunk_sums[o] = s;
  }
  __syncthreads();
  // Per group slot: the sum of its channels in this chunk (a slot past the chunk's groups gets 0s,
  // which no fold reads).
  const int64_t first = first_group(p, w.chunk);
  const int64_t chunk_begin = w.chunk * p.chunk_width;
  const int64_t chunk_end = std::min(p.channels, chunk_begin + p.chunk_width);
  const auto channels_of = [&](int slot, int64_t* begin) {
    const int64_t g = first + slot;
    *begin = std::max(g * p.per_group, chunk_begin);
    return std::max<int64_t>(0, std::min((g + 1) * p.per_group, chunk_end) - *begin);
  };
  Pair<Acc>* out = ws.group_sums + (partial * p.chunks + w.chunk) * p.slots;
  team_fold<Acc>(
      p.slots,
      [&](int slot) {
        int64_t begin;
        return channels_of(slot, &begin);
      },
      [&](int slot, int64_t t) {
        int64_t begin;
        channels_of(slot, &begin);
        return chunk_sums[begin - chunk_begin + t];
      },
      [&](int slot, const Pair<Acc>& sum) { out[slot] = sum; });
}

// The output of Pass over the block's tile; blocks walk the tiles last-read-first.
template <class T, int kVec, Layout kLayout, class Pass, class Args>
__global__ void __launch_bounds__(kThreads, Pass::kBlocks) apply_kernel(Args args, Plan p, T* out) {
  using Acc = acc_type<T>;
  extern __shared__ unsigned char shared_bytes[];
  Pair<Acc>* slot_table = reinterpret_cast<Pair<Acc>*>(shared_bytes);  // [slots]
  const Workspace<Acc> ws = carve<Acc>(args.workspace, p);
  const int64_t block = gridDim.x - 1 - blockIdx.x;
  const Walk<kVec> w = walk_of<kLayout, kVec>(p, block);
  // Launched before the sums pass has finished (dependent launch): wait for its sums, then fold them.
  cuda::wait_for_prerequisite_grid();
  group_coefficients<T>(args, p, ws, w, slot_table);
  __syncthreads();
  Pass pass;
  pass.prepare(args, p, slot_table, w);
  const T* dy = nullptr;
  if constexpr (Pass::kReadsDy) dy = static_cast<const T*>(args.dy);
  walk_packs<Pass, true>(w, static_cast<const T*>(args.x), dy, [&](int64_t at, const auto& xs, const auto& dys) {
    AlignedVector<T, kVec> o;
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      Acc d = Acc(0);
      if constexpr (Pass::kReadsDy) d = static_cast<Acc>(dys.value[l]);
      o.value[l] = static_cast<T>(pass.template value<kVectorPath<kVec>>(l, static_cast<Acc>(xs.value[l]), d));
    }
    store_pack<kVec>(out, at, o);
  });
}

// ---- host ----------------------------------------------------------------------------------------

// kVec where every pack is a whole aligned vector (NHWC: C a multiple of it; NCHW: S), else 1.
template <int kVec>
int vector_width_for(const Shape& shape, std::initializer_list<const void*> pointers) {
  const int64_t row = shape.layout == Layout::kNhwc ? shape.channels : shape.spatial;
  bool ok = row % kVec == 0;
  for (const void* ptr : pointers) ok = ok && (ptr == nullptr || is_aligned(ptr));
  return ok ? kVec : 1;
}

// The launch over `shape` in packs of `vec`, for a kernel of which `blocks_per_sm` blocks are
// resident per SM, with at most `max_splits` splits (0: no cap) unless fewer leave SMs idle.
Plan plan_for(const Shape& shape, int vec, const Cuda& device, int blocks_per_sm, int64_t max_splits = 0) {
  Plan p{};
  p.samples = shape.samples, p.channels = shape.channels, p.groups = shape.groups, p.spatial = shape.spatial;
  p.per_group = shape.channels / shape.groups;
  int64_t span;  // the spatial axis in the units a thread steps along
  if (shape.layout == Layout::kNhwc) {
    const int64_t packs = shape.channels / vec;
    const int64_t narrowest = (packs + kMaxCols - 1) / kMaxCols;  // chunks of at most kMaxCols packs
    const cuda::BlockTile tile = cuda::block_tile((packs + narrowest - 1) / narrowest, kThreads);
    p.cols = tile.cols, p.rows = tile.rows;
    p.chunks = static_cast<int>((packs + p.cols - 1) / p.cols);
    p.chunk_width = static_cast<int64_t>(p.cols) * vec;
    span = shape.spatial;
  } else {
    const int64_t packs = shape.spatial / vec;
    p.cols = static_cast<int>(std::min<int64_t>(std::max<int64_t>(packs, 1), kNchwLanes));
    p.rows = static_cast<int>(std::min<int64_t>(kThreads / p.cols, shape.channels));
    p.chunks = static_cast<int>((shape.channels + p.rows - 1) / p.rows);
    p.chunk_width = p.rows;
    span = packs;
  }
  p.threads = cuda::whole_warps(p.cols * p.rows);
  // A chunk of W channels touches at most (W - 1) / per_group + 2 groups.
  p.slots = static_cast<int>(std::min<int64_t>(shape.groups, (p.chunk_width - 1) / p.per_group + 2));
  // Splits of S: as many blocks as fit one wave, but each thread at least kMinSplitPacks packs.
  const int per_row = shape.layout == Layout::kNhwc ? p.rows : p.cols;
  const int64_t sms = cuda::sm_count(device.device);
  const int64_t wanted = sms * blocks_per_sm / (shape.samples * p.chunks);
  const int64_t most = std::max<int64_t>(1, span / (static_cast<int64_t>(per_row) * kMinSplitPacks));
  int64_t splits = std::min(wanted, most);
  if (max_splits > 0) {
    const int64_t fill = (sms + shape.samples * p.chunks - 1) / (shape.samples * p.chunks);
    splits = std::min(splits, std::max(max_splits, fill));
  }
  p.splits = static_cast<int>(std::max<int64_t>(1, splits));
  p.split_len = (span + p.splits - 1) / p.splits;
  p.splits = static_cast<int>((span + p.split_len - 1) / p.split_len);  // no empty split
  p.blocks_per_sample = static_cast<int64_t>(p.splits) * p.chunks;
  p.sum_splits = p.splits;
  return p;
}

// The backward's split cap: its per-channel sums (C pairs a split) under 1/kChannelSumsShare of x.
int64_t channel_sums_split_cap(const Shape& shape, int64_t element_bytes, int64_t acc_bytes) {
  return std::max<int64_t>(1, shape.spatial * element_bytes / (2 * acc_bytes * kChannelSumsShare));
}

// sums then apply, over the plan's grid; `pointers` are the data the vector path needs aligned.
template <class T, template <class, int, Layout> class Sums, template <class, int> class Apply, class Args>
void run(const Cuda& device, const Args& args, T* out, std::initializer_list<const void*> pointers, const char* op) {
  using Acc = acc_type<T>;
  constexpr int kVec = vector_width<T>();
  const Shape& shape = args.shape;
  const int vec = vector_width_for<kVec>(shape, pointers);
  const cudaStream_t stream = cuda::stream(device);
  const int64_t max_splits = Sums<T, 1, Layout::kNhwc>::kChannelSums
                                 ? channel_sums_split_cap(shape, sizeof(T), sizeof(Acc))
                                 : 0;
  const auto launch = [&](auto layout, auto width) {
    constexpr Layout kLayout = decltype(layout)::value;
    constexpr int kWidth = decltype(width)::value;
    const auto sums = sums_kernel<T, kWidth, kLayout, Sums<T, kWidth, kLayout>, Args>;
    const auto apply = apply_kernel<T, kWidth, kLayout, Apply<T, kWidth>, Args>;
    const Plan any = plan_for(shape, kWidth, device, 1);  // the block shape: the same for every grid
    const size_t sums_shared = sizeof(Pair<Acc>) * (static_cast<size_t>(any.threads) * kWidth + any.chunk_width);
    const size_t apply_shared = sizeof(Pair<Acc>) * any.slots;
    const Plan sum_plan = plan_for(shape, kWidth, device, cuda::resident_blocks_per_sm(
        reinterpret_cast<const void*>(sums), any.threads, sums_shared, device.device), max_splits);
    Plan apply_plan = plan_for(shape, kWidth, device, cuda::resident_blocks_per_sm(
        reinterpret_cast<const void*>(apply), any.threads, apply_shared, device.device));
    apply_plan.sum_splits = sum_plan.splits;
    sums<<<static_cast<unsigned>(shape.samples * sum_plan.blocks_per_sample), any.threads, sums_shared, stream>>>(
        args, sum_plan);
    cuda::launch_dependent(device, apply, dim3(static_cast<unsigned>(shape.samples * apply_plan.blocks_per_sample)),
                           dim3(any.threads), apply_shared, stream, args, apply_plan, out);
  };
  const auto with_layout = [&](auto layout) {
    if (vec == kVec) {
      launch(layout, std::integral_constant<int, kVec>{});
    } else {
      launch(layout, std::integral_constant<int, 1>{});
    }
  };
  if (shape.layout == Layout::kNhwc) {
    with_layout(std::integral_constant<Layout, Layout::kNhwc>{});
  } else {
    with_layout(std::integral_constant<Layout, Layout::kNchw>{});
  }
  cuda::check_launch(op);
}

// BackwardSums as the layout-taking template run() expects (its sums do not depend on the layout).
template <class T, int kVec, Layout>
using BackwardSumsOf = BackwardSums<T, kVec>;

}  // namespace

// The launches of one dtype: sums, then apply (see the top of this file).
template <class T>
void forward_as(const Cuda& device, const ForwardArgs& args) {
  run<T, ForwardSums, ForwardApply>(device, args, static_cast<T*>(args.y), {args.x, args.y}, "group_norm_forward");
}

template <class T>
void backward_as(const Cuda& device, const BackwardArgs& args) {
  run<T, BackwardSumsOf, BackwardApply>(device, args, static_cast<T*>(args.dx), {args.x, args.dy, args.dx},
                                        "group_norm_backward");
}

// Compiled by group_norm_{forward,backward}_{half_bfloat16,float_double}.cu.
extern template void forward_as<c10::Half>(const Cuda&, const ForwardArgs&);
extern template void forward_as<c10::BFloat16>(const Cuda&, const ForwardArgs&);
extern template void forward_as<float>(const Cuda&, const ForwardArgs&);
extern template void forward_as<double>(const Cuda&, const ForwardArgs&);
extern template void backward_as<c10::Half>(const Cuda&, const BackwardArgs&);
extern template void backward_as<c10::BFloat16>(const Cuda&, const BackwardArgs&);
extern template void backward_as<float>(const Cuda&, const BackwardArgs&);
extern template void backward_as<double>(const Cuda&, const BackwardArgs&);

}  // namespace apex::group_norm
