// group_norm: CUDA kernels.
//
// Each direction is two launches over the same grid, plus a 4-byte-per-sample memset:
//   sums:  each block reads its tile of one sample once and writes per-channel partial sums; the
//          last block of a sample to finish (a per-sample counter) folds the sample's partials into
//          per-channel coefficients, so the next launch is a pure elementwise pass;
//   apply: each block re-reads its tile and writes the output with those coefficients. It walks
//          the tiles in reverse order: the tiles the sums launch read last are still in L2.
// Forward:  sums of (x - shift) and its square, shift = the group's first element (so the sum of
//           squares never cancels catastrophically); coefficients a = rstd w, b = bias - mean a;
//           apply y = act(a x + b).
// Backward: sums of dz and dz * xhat per channel (dz = dy * act'(z)); the per-sample fold turns
//           them into group means of w dz and w dz xhat and per-channel coefficients of
//           dx = a dz + B x + D; the last sample's fold also sums grad_weight / grad_bias over
//           samples. Every sum is taken in a fixed order: results are deterministic.
//
// Tiles: a block is a cols x rows grid of threads, each thread holding one pack of kVec elements
// (a 16-byte vector when the layout allows, else one element) and walking it along the spatial
// axis:
//   NHWC: a sample is [S, C]; thread (r, k) takes channel pack k of a chunk of channels (fixed for
//         good) at positions r, r + rows, ... of its split of S.
//   NCHW: a sample is [C, S]; thread (r, k) takes channel r of the block's channels, at packs
//         k, k + cols, ... of its split of S (every lane of a pack in the same channel).
#include "apex/acc_type.h"
#include "apex/cuda.cuh"
#include "apex/occupancy.cuh"
#include "group_norm.h"
#include "group_norm_math.h"

namespace apex::group_norm {
namespace {

// Threads per block. Each kernel's grid is one wave: as many blocks as its occupancy keeps resident
// (a second, partial wave left SMs idle; more blocks also mean more partial sums to fold).
constexpr int kThreads = 256;
// Partial sums a folding thread loads before adding any (the fold is the sums kernel's serial tail:
// one load in flight at a time made it ~20 us).
constexpr int kFoldBatch = 8;
// Threads an SM holds at most (Hopper, Ampere; bounds the workspace's partial sums).
constexpr int kMaxThreadsPerSm = 2048;
// Packs a thread loads (per input) before using any: the backward reads two inputs, so half as many
// of each (the same bytes in flight, and registers for its four per-lane coefficients).
constexpr int kForwardUnroll = 4;
constexpr int kBackwardUnroll = 2;
// Blocks per SM every kernel must fit (__launch_bounds__): at most 128 registers a thread.
constexpr int kMinBlocksPerSm = 2;
// NCHW: threads along S per channel, so a channel's partial is a sum of this many threads'.
constexpr int kNchwLanes = 32;

// What a launch covers. Blocks are numbered sample-major: block b is sample b / blocks_per_sample,
// split (b % blocks_per_sample) / chunks, chunk (b % blocks_per_sample) % chunks.
struct Plan {
  int64_t samples, channels, groups, spatial, per_group;
  int cols, rows;             // the block's thread grid (see the file comment)
  int chunks;                 // NHWC: channel chunks of cols packs; NCHW: channel blocks of rows channels
  int splits;                 // parts of the spatial axis
  int64_t split_len;          // NHWC: positions per split; NCHW: packs per split
  int64_t blocks_per_sample;  // splits * chunks
};

template <class Acc>
struct Pair {
  Acc a, b;
};

// Per-channel coefficients the folds write and the apply passes read: forward uses (a, b),
// backward all four (dx = a dz + B x + D, z = a x + b).
template <class Acc>
struct Coefficients {
  Acc a, b, B, D;
};

template <class Acc>
struct Workspace {
  unsigned* counters;          // [N + 1]: finished blocks per sample; finished samples (backward)
  Pair<Acc>* channel;          // [N, C]: a sample's per-channel sums
  Pair<Acc>* group;            // [N, G]: backward's per-group (B, D)
  Coefficients<Acc>* coefficients;  // [N, C]
  Pair<Acc>* partial;          // [N, splits, C], last: the sums and apply grids differ in splits only
};

C10_HOST_DEVICE constexpr int64_t align_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The workspace's arrays, each on a 256-byte boundary, in the order of the struct; `base` null
// only measures (the end pointer is then the byte count).
template <class Acc>
C10_HOST_DEVICE Workspace<Acc> carve(void* base, const Plan& p, int64_t* bytes = nullptr) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(base);
  int64_t at = 0;
  Workspace<Acc> ws;
  ws.counters = reinterpret_cast<unsigned*>(start + at);
  at += align_up(sizeof(unsigned) * (p.samples + 1));
  ws.channel = reinterpret_cast<Pair<Acc>*>(start + at);
  at += align_up(sizeof(Pair<Acc>) * p.samples * p.channels);
  ws.group = reinterpret_cast<Pair<Acc>*>(start + at);
  at += align_up(sizeof(Pair<Acc>) * p.samples * p.groups);
  ws.coefficients = reinterpret_cast<Coefficients<Acc>*>(start + at);
  at += align_up(sizeof(Coefficients<Acc>) * p.samples * p.channels);
  ws.partial = reinterpret_cast<Pair<Acc>*>(start + at);
  at += align_up(sizeof(Pair<Acc>) * p.samples * p.splits * p.channels);
  if (bytes != nullptr) *bytes = at;
  return ws;
}

template <class Acc>
int64_t carved_bytes(const Plan& p) {
  int64_t bytes = 0;
  carve<Acc>(nullptr, p, &bytes);
  return bytes;
}

// Another block's global writes, read past this SM's L1 (which may hold nothing of them yet, but
// the read must not be served from a stale line either way).
template <class T>
C10_DEVICE C10_ALWAYS_INLINE T load_fresh(const T* p) {
#if defined(USE_ROCM)
  return *reinterpret_cast<const volatile T*>(p);
#else
  return __ldcg(p);
#endif
}

// ---- where a thread works -------------------------------------------------------------------

// A thread's packs: `count` of them at element offsets first + j * stride, lane k of each in
// channel channel[k] (the same channel for every pack).
template <int kVec>
struct Walk {
  int64_t sample, first, stride;
  int count;
  int64_t channel[kVec];
  int64_t block_in_sample, split, chunk;
};

template <Layout kLayout, int kVec>
C10_DEVICE Walk<kVec> walk_of(const Plan& p, int64_t block) {
  Walk<kVec> w;
  w.sample = block / p.blocks_per_sample;
  w.block_in_sample = block - w.sample * p.blocks_per_sample;
  w.split = w.block_in_sample / p.chunks;
  w.chunk = w.block_in_sample - w.split * p.chunks;
  const int r = static_cast<int>(threadIdx.x) / p.cols, k = static_cast<int>(threadIdx.x) % p.cols;
  if constexpr (kLayout == Layout::kNhwc) {
    const int64_t pack = w.chunk * p.cols + k;
    const int64_t begin = w.split * p.split_len + r, end = std::min(p.spatial, (w.split + 1) * p.split_len);
    const bool valid = pack * kVec < p.channels && begin < end;
    w.count = valid ? static_cast<int>((end - begin + p.rows - 1) / p.rows) : 0;
    w.first = (w.sample * p.spatial + begin) * p.channels + pack * kVec;
    w.stride = static_cast<int64_t>(p.rows) * p.channels;
#pragma unroll
    for (int l = 0; l < kVec; ++l) w.channel[l] = pack * kVec + l;
  } else {
    const int64_t channel = w.chunk * p.rows + r, packs = p.spatial / kVec;
    const int64_t begin = w.split * p.split_len + k, end = std::min(packs, (w.split + 1) * p.split_len);
    const bool valid = channel < p.channels && begin < end;
    w.count = valid ? static_cast<int>((end - begin + p.cols - 1) / p.cols) : 0;
    w.first = (w.sample * p.channels + channel) * p.spatial + begin * kVec;
    w.stride = static_cast<int64_t>(p.cols) * kVec;
#pragma unroll
    for (int l = 0; l < kVec; ++l) w.channel[l] = channel;
  }
  return w;
}

// ---- what a pass does at each element ----------------------------------------------------------

// Each pass: `prepare` reads its per-lane coefficients once, `visit` handles lane l of a pack.

// Forward sums: (x - shift, its square), shift = the first element of the lane's group.
template <class T, int kVec, Layout kLayout>
struct ForwardSums {
  using Acc = acc_type<T>;
  static constexpr bool kReadsDy = false;
  static constexpr int kUnroll = kForwardUnroll;
  Acc shift[kVec];

  C10_DEVICE void prepare(const ForwardArgs& args, const Plan& p, const Workspace<Acc>&, const Walk<kVec>& w) {
    const T* x = static_cast<const T*>(args.x);
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      const int64_t first_channel = std::min(w.channel[l], p.channels - 1) / p.per_group * p.per_group;
      const int64_t at = kLayout == Layout::kNhwc ? w.sample * p.spatial * p.channels + first_channel
                                                  : (w.sample * p.channels + first_channel) * p.spatial;
      shift[l] = static_cast<Acc>(x[at]);
    }
  }

  C10_DEVICE C10_ALWAYS_INLINE void visit(int l, Acc x, Acc, Pair<Acc>& sum) const {
    const Acc d = x - shift[l];
    sum.a += d;
    sum.b += d * d;
  }
};

// Backward sums: (dz, dz * xhat).
template <class T, int kVec>
struct BackwardSums {
  using Acc = acc_type<T>;
  static constexpr bool kReadsDy = true;
  static constexpr int kUnroll = kBackwardUnroll;
  Acc scale[kVec], offset[kVec];  // xhat = scale x + offset
  Acc weight[kVec], bias[kVec];   // z = weight xhat + bias (SiLU only)
  bool silu;

  C10_DEVICE void prepare(const BackwardArgs& args, const Plan& p, const Workspace<Acc>&, const Walk<kVec>& w) {
    silu = args.silu;
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      const int64_t c = std::min(w.channel[l], p.channels - 1), gid = w.sample * p.groups + c / p.per_group;
      const Acc rstd = static_cast<const Acc*>(args.rstd)[gid], mean = static_cast<const Acc*>(args.mean)[gid];
      scale[l] = rstd;
      offset[l] = -mean * rstd;
      weight[l] = args.weight != nullptr ? static_cast<const Acc*>(args.weight)[c] : Acc(1);
      bias[l] = args.bias != nullptr ? static_cast<const Acc*>(args.bias)[c] : Acc(0);
    }
  }

  C10_DEVICE C10_ALWAYS_INLINE void visit(int l, Acc x, Acc dy, Pair<Acc>& sum) const {
    const Acc xhat = x * scale[l] + offset[l];
    const Acc dz = silu ? dy * activation_slope(xhat * weight[l] + bias[l], true) : dy;
    sum.a += dz;
    sum.b += dz * xhat;
  }
};

// Forward output: y = act(a x + b).
template <class T, int kVec>
struct ForwardApply {
  using Acc = acc_type<T>;
  static constexpr bool kReadsDy = false;
  static constexpr int kUnroll = kForwardUnroll;
  Acc a[kVec], b[kVec];
  bool silu;

  C10_DEVICE void prepare(const ForwardArgs& args, const Plan& p, const Workspace<Acc>& ws, const Walk<kVec>& w) {
    silu = args.silu;
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      const Coefficients<Acc> k = ws.coefficients[w.sample * p.channels + std::min(w.channel[l], p.channels - 1)];
      a[l] = k.a;
      b[l] = k.b;
    }
  }

  C10_DEVICE C10_ALWAYS_INLINE Acc value(int l, Acc x, Acc) const { return activate(x * a[l] + b[l], silu); }
};

// Backward output: dx = a dz + B x + D, dz = dy act'(a x + b).
template <class T, int kVec>
struct BackwardApply {
  using Acc = acc_type<T>;
  static constexpr bool kReadsDy = true;
  static constexpr int kUnroll = kBackwardUnroll;
  Coefficients<Acc> k[kVec];
  bool silu;

  C10_DEVICE void prepare(const BackwardArgs& args, const Plan& p, const Workspace<Acc>& ws, const Walk<kVec>& w) {
    silu = args.silu;
#pragma unroll
    for (int l = 0; l < kVec; ++l) k[l] = ws.coefficients[w.sample * p.channels + std::min(w.channel[l], p.channels - 1)];
  }

  C10_DEVICE C10_ALWAYS_INLINE Acc value(int l, Acc x, Acc dy) const {
    const Acc dz = silu ? dy * activation_slope(x * k[l].a + k[l].b, true) : dy;
    return k[l].a * dz + k[l].B * x + k[l].D;
  }
};

// ---- the walk ------------------------------------------------------------------------------------

// Calls f(j, x pack, dy pack) for each of the thread's packs, kUnroll packs' loads ahead.
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
      if (j + u < w.count) f(j + u, xs[u], dys[u]);
    }
  }
}

// ---- the folds (run by the last block of a sample) ------------------------------------------------

// The sample's per-channel sums: its partials added over splits, in split order.
template <class Acc>
C10_DEVICE void fold_channels(const Plan& p, const Workspace<Acc>& ws, int64_t n) {
  for (int64_t c = threadIdx.x; c < p.channels; c += blockDim.x) {
    Pair<Acc> s{Acc(0), Acc(0)};
    const Pair<Acc>* partial = ws.partial + n * p.splits * p.channels + c;
    for (int first = 0; first < p.splits; first += kFoldBatch) {
      Pair<Acc> batch[kFoldBatch];
#pragma unroll
      for (int i = 0; i < kFoldBatch; ++i) {
        if (first + i < p.splits) {
          batch[i] = {load_fresh(&partial[(first + i) * p.channels].a), load_fresh(&partial[(first + i) * p.channels].b)};
        }
      }
#pragma unroll
      for (int i = 0; i < kFoldBatch; ++i) {
        if (first + i < p.splits) s.a += batch[i].a, s.b += batch[i].b;
      }
    }
    ws.channel[n * p.channels + c] = s;
  }
  __syncthreads();  // the block's writes above are visible to the whole block after it
}

template <class T>
C10_DEVICE void finish_forward(const ForwardArgs& args, const Plan& p, const Workspace<acc_type<T>>& ws, int64_t n) {
  using Acc = acc_type<T>;
  fold_channels(p, ws, n);
  Acc* means = static_cast<Acc*>(args.mean);
  Acc* rstds = static_cast<Acc*>(args.rstd);
  const Acc count = static_cast<Acc>(p.per_group * p.spatial);
  for (int64_t g = threadIdx.x; g < p.groups; g += blockDim.x) {
    Pair<Acc> s{Acc(0), Acc(0)};
    for (int64_t c = g * p.per_group; c < (g + 1) * p.per_group; ++c) {
      s.a += ws.channel[n * p.channels + c].a;
      s.b += ws.channel[n * p.channels + c].b;
    }
    const int64_t first_channel = g * p.per_group;
    const T* x = static_cast<const T*>(args.x);
    const int64_t at = args.shape.layout == Layout::kNhwc ? n * p.spatial * p.channels + first_channel
                                                          : (n * p.channels + first_channel) * p.spatial;
    const Moments<Acc> m = moments(s.a, s.b, static_cast<Acc>(x[at]), count, args.eps);
    means[n * p.groups + g] = m.mean;
    rstds[n * p.groups + g] = m.rstd;
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const int64_t gid = n * p.groups + c / p.per_group;
    const Acc w = args.weight != nullptr ? static_cast<const Acc*>(args.weight)[c] : Acc(1);
    const Acc b = args.bias != nullptr ? static_cast<const Acc*>(args.bias)[c] : Acc(0);
    const Acc a = rstds[gid] * w;
    ws.coefficients[n * p.channels + c] = {a, b - means[gid] * a, Acc(0), Acc(0)};
  }
}

template <class T>
C10_DEVICE void finish_backward(const BackwardArgs& args, const Plan& p, const Workspace<acc_type<T>>& ws, int64_t n) {
  using Acc = acc_type<T>;
  fold_channels(p, ws, n);
  const Acc* weight = static_cast<const Acc*>(args.weight);
  const Acc* bias = static_cast<const Acc*>(args.bias);
  const Acc* means = static_cast<const Acc*>(args.mean);
  const Acc* rstds = static_cast<const Acc*>(args.rstd);
  const Acc count = static_cast<Acc>(p.per_group * p.spatial);
  for (int64_t g = threadIdx.x; g < p.groups; g += blockDim.x) {
    Acc wdz = Acc(0), wdz_xhat = Acc(0);
    for (int64_t c = g * p.per_group; c < (g + 1) * p.per_group; ++c) {
      const Acc w = weight != nullptr ? weight[c] : Acc(1);
      wdz += w * ws.channel[n * p.channels + c].a;
      wdz_xhat += w * ws.channel[n * p.channels + c].b;
    }
    // dx = rstd (w dz - mean(w dz) - xhat mean(w dz xhat)), xhat = (x - mean) rstd
    const Acc rstd = rstds[n * p.groups + g], mean = means[n * p.groups + g];
    const Acc m1 = wdz / count, m2 = wdz_xhat / count;
    const Acc B = -rstd * rstd * m2;
    ws.group[n * p.groups + g] = {B, -rstd * m1 - B * mean};
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const int64_t gid = n * p.groups + c / p.per_group;
    const Acc w = weight != nullptr ? weight[c] : Acc(1), b = bias != nullptr ? bias[c] : Acc(0);
    const Acc a = rstds[gid] * w;
    const Pair<Acc> bd = ws.group[gid];
    ws.coefficients[n * p.channels + c] = {a, b - means[gid] * a, bd.a, bd.b};
  }
  if (args.grad_weight == nullptr && args.grad_bias == nullptr) return;
  // The last sample to finish sums every sample's channel sums into the parameter gradients.
  __shared__ bool last_sample;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_sample = atomicAdd(ws.counters + p.samples, 1u) == p.samples - 1;
  __syncthreads();
  if (!last_sample) return;
  __threadfence();
  for (int64_t c = threadIdx.x; c < p.channels; c += blockDim.x) {
    Acc dz = Acc(0), dz_xhat = Acc(0);
    for (int64_t first = 0; first < p.samples; first += kFoldBatch) {
      Pair<Acc> batch[kFoldBatch];
#pragma unroll
      for (int i = 0; i < kFoldBatch; ++i) {
        if (first + i < p.samples) {
          const Pair<Acc>* at = &ws.channel[(first + i) * p.channels + c];
          batch[i] = {load_fresh(&at->a), load_fresh(&at->b)};
        }
      }
#pragma unroll
      for (int i = 0; i < kFoldBatch; ++i) {
        if (first + i < p.samples) dz += batch[i].a, dz_xhat += batch[i].b;
      }
    }
    if (args.grad_weight != nullptr) static_cast<Acc*>(args.grad_weight)[c] = dz_xhat;
    if (args.grad_bias != nullptr) static_cast<Acc*>(args.grad_bias)[c] = dz;
  }
}

template <class T>
C10_DEVICE void finish(const ForwardArgs& args, const Plan& p, const Workspace<acc_type<T>>& ws, int64_t n) {
  finish_forward<T>(args, p, ws, n);
}
template <class T>
C10_DEVICE void finish(const BackwardArgs& args, const Plan& p, const Workspace<acc_type<T>>& ws, int64_t n) {
  finish_backward<T>(args, p, ws, n);
}

// ---- kernels ---------------------------------------------------------------------------------------

// The block's per-channel partial sums of Pass's pairs, then (last block of a sample) its fold.
template <class T, int kVec, Layout kLayout, class Pass, class Args>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) sums_kernel(Args args, Plan p) {
  using Acc = acc_type<T>;
  extern __shared__ unsigned char shared_bytes[];
  Pair<Acc>* shared = reinterpret_cast<Pair<Acc>*>(shared_bytes);
  __shared__ bool last_block;
  const Workspace<Acc> ws = carve<Acc>(args.workspace, p);
  const Walk<kVec> w = walk_of<kLayout, kVec>(p, blockIdx.x);
  Pass pass;
  pass.prepare(args, p, ws, w);
  Pair<Acc> sums[kVec];
#pragma unroll
  for (int l = 0; l < kVec; ++l) sums[l] = {Acc(0), Acc(0)};
  const T* dy = nullptr;
  if constexpr (Pass::kReadsDy) dy = static_cast<const T*>(args.dy);
  for_each_pack<T, kVec, Pass::kUnroll, Pass::kReadsDy>(w, static_cast<const T*>(args.x), dy, [&](int, const auto& xs, const auto& dys) {
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      Acc d = Acc(0);
      if constexpr (Pass::kReadsDy) d = static_cast<Acc>(dys.value[l]);
      pass.visit(l, static_cast<Acc>(xs.value[l]), d, sums[l]);
    }
  });
  // Across the block, in a fixed order: NHWC adds the rows of each (pack, lane), NCHW first the lanes
  // of a pack (one channel) and then the cols of each row.
  const int threads = p.cols * p.rows;
  if constexpr (kLayout == Layout::kNhwc) {
#pragma unroll
    for (int l = 0; l < kVec; ++l) shared[threadIdx.x * kVec + l] = sums[l];
  } else {
    Pair<Acc> s = sums[0];
#pragma unroll
    for (int l = 1; l < kVec; ++l) s.a += sums[l].a, s.b += sums[l].b;
    shared[threadIdx.x] = s;
  }
  __syncthreads();
  Pair<Acc>* partial = ws.partial + (w.sample * p.splits + w.split) * p.channels;
  if constexpr (kLayout == Layout::kNhwc) {
    const int outputs = p.cols * kVec;
    for (int o = threadIdx.x; o < outputs; o += threads) {
      const int64_t c = w.chunk * outputs + o;
      if (c >= p.channels) continue;
      Pair<Acc> s{Acc(0), Acc(0)};
      for (int r = 0; r < p.rows; ++r) s.a += shared[r * outputs + o].a, s.b += shared[r * outputs + o].b;
      partial[c] = s;
    }
  } else {
    for (int r = threadIdx.x; r < p.rows; r += threads) {
      const int64_t c = w.chunk * p.rows + r;
      if (c >= p.channels) continue;
      Pair<Acc> s{Acc(0), Acc(0)};
      for (int k = 0; k < p.cols; ++k) s.a += shared[r * p.cols + k].a, s.b += shared[r * p.cols + k].b;
      partial[c] = s;
    }
  }
  // The last block of the sample to get here folds it.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last_block = atomicAdd(ws.counters + w.sample, 1u) == static_cast<unsigned>(p.blocks_per_sample - 1);
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  finish<T>(args, p, ws, w.sample);
}

// The output of Pass over the block's tile; blocks walk the tiles last-read-first.
template <class T, int kVec, Layout kLayout, class Pass, class Args>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) apply_kernel(Args args, Plan p, T* out) {
  using Acc = acc_type<T>;
  const Workspace<Acc> ws = carve<Acc>(args.workspace, p);
  const Walk<kVec> w = walk_of<kLayout, kVec>(p, gridDim.x - 1 - blockIdx.x);
  Pass pass;
  pass.prepare(args, p, ws, w);
  const T* dy = nullptr;
  if constexpr (Pass::kReadsDy) dy = static_cast<const T*>(args.dy);
  for_each_pack<T, kVec, Pass::kUnroll, Pass::kReadsDy>(w, static_cast<const T*>(args.x), dy, [&](int j, const auto& xs, const auto& dys) {
    AlignedVector<T, kVec> o;
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      Acc d = Acc(0);
      if constexpr (Pass::kReadsDy) d = static_cast<Acc>(dys.value[l]);
      o.value[l] = static_cast<T>(pass.value(l, static_cast<Acc>(xs.value[l]), d));
    }
    store_vector<kVec>(out, w.first + j * w.stride, o);
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
// resident per SM.
Plan plan_for(const Shape& shape, int vec, const Cuda& device, int blocks_per_sm) {
  Plan p{};
  p.samples = shape.samples, p.channels = shape.channels, p.groups = shape.groups, p.spatial = shape.spatial;
  p.per_group = shape.channels / shape.groups;
  int64_t span;  // the spatial axis in the units a thread steps along
  if (shape.layout == Layout::kNhwc) {
    const cuda::BlockTile tile = cuda::block_tile(shape.channels / vec, kThreads);
    p.cols = tile.cols, p.rows = tile.rows;
    p.chunks = static_cast<int>((shape.channels / vec + p.cols - 1) / p.cols);
    span = shape.spatial;
  } else {
    const int64_t packs = shape.spatial / vec;
    p.cols = static_cast<int>(std::min<int64_t>(std::max<int64_t>(packs, 1), kNchwLanes));
    p.rows = static_cast<int>(std::min<int64_t>(kThreads / p.cols, shape.channels));
    p.chunks = static_cast<int>((shape.channels + p.rows - 1) / p.rows);
    span = packs;
  }
  // Splits of S: as many blocks as fit one wave, but each thread at least a forward unroll of packs.
  const int per_row = shape.layout == Layout::kNhwc ? p.rows : p.cols;
  const int64_t wave = static_cast<int64_t>(cuda::sm_count(device.device)) * blocks_per_sm;
  const int64_t wanted = wave / (shape.samples * p.chunks);
  const int64_t most = std::max<int64_t>(1, span / (static_cast<int64_t>(per_row) * kForwardUnroll));
  p.splits = static_cast<int>(std::max<int64_t>(1, std::min(wanted, most)));
  p.split_len = (span + p.splits - 1) / p.splits;
  p.splits = static_cast<int>((span + p.split_len - 1) / p.split_len);  // no empty split
  p.blocks_per_sample = static_cast<int64_t>(p.splits) * p.chunks;
  return p;
}

size_t shared_bytes_for(const Plan& p, int vec, int64_t acc_bytes) {
  return static_cast<size_t>(p.cols) * p.rows * vec * 2 * acc_bytes;
}

// sums then apply, over the plan's grid; `pointers` are the data the vector path needs aligned.
template <class T, template <class, int, Layout> class Sums, template <class, int> class Apply, class Args>
void run(const Cuda& device, const Args& args, T* out, std::initializer_list<const void*> pointers, const char* op) {
  using Acc = acc_type<T>;
  constexpr int kVec = vector_width<T>();
  const Shape& shape = args.shape;
  const int vec = vector_width_for<kVec>(shape, pointers);
  const cudaStream_t stream = cuda::stream(device);
  const auto launch = [&](auto layout, auto width) {
    constexpr Layout kLayout = decltype(layout)::value;
    constexpr int kWidth = decltype(width)::value;
    const auto sums = sums_kernel<T, kWidth, kLayout, Sums<T, kWidth, kLayout>, Args>;
    const auto apply = apply_kernel<T, kWidth, kLayout, Apply<T, kWidth>, Args>;
    const Plan any = plan_for(shape, kWidth, device, 1);  // the block shape: the same for every grid
    const int threads = any.cols * any.rows;
    const size_t shared = shared_bytes_for(any, kWidth, sizeof(Acc));
    const Plan sum_plan = plan_for(shape, kWidth, device, cuda::resident_blocks_per_sm(
                                                              reinterpret_cast<const void*>(sums), threads, shared, device.device));
    const Plan apply_plan = plan_for(shape, kWidth, device, cuda::resident_blocks_per_sm(
                                                                reinterpret_cast<const void*>(apply), threads, 0, device.device));
    const Workspace<Acc> ws = carve<Acc>(args.workspace, sum_plan);
    cuda::check(cudaMemsetAsync(ws.counters, 0, sizeof(unsigned) * (shape.samples + 1), stream), op);
    sums<<<static_cast<unsigned>(shape.samples * sum_plan.blocks_per_sample), threads, shared, stream>>>(args, sum_plan);
    apply<<<static_cast<unsigned>(shape.samples * apply_plan.blocks_per_sample), threads, 0, stream>>>(args, apply_plan, out);
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

int64_t workspace_bytes(const Cuda& device, const Shape& shape, Dtype dtype) {
  if (shape.samples == 0 || shape.channels == 0 || shape.spatial == 0) return 0;
  int64_t bytes = 0;
  dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The plan's vector width depends on the pointers' alignment: room for either.
    for (const int vec : {vector_width<T>(), 1}) {
      if (shape.layout == Layout::kNhwc ? shape.channels % vec : shape.spatial % vec) continue;
      // As many blocks resident as the SM has threads for: an upper bound of the sums grid's
      // residency, so of its splits.
      const Plan any = plan_for(shape, vec, device, 1);
      const int most_resident = std::max(1, kMaxThreadsPerSm / (any.cols * any.rows));
      bytes = std::max(bytes, carved_bytes<acc_type<T>>(plan_for(shape, vec, device, most_resident)));
    }
  });
  return bytes;
}

void forward(const Cuda& device, const ForwardArgs& args) {
  const Shape& shape = args.shape;
  if (shape.samples == 0 || shape.channels == 0 || shape.spatial == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    run<T, ForwardSums, ForwardApply>(device, args, static_cast<T*>(args.y), {args.x, args.y}, "group_norm_forward");
  });
}

void backward(const Cuda& device, const BackwardArgs& args) {
  const Shape& shape = args.shape;
  if (shape.channels == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_type<T>;
    if (shape.samples == 0 || shape.spatial == 0) {  // no elements: the parameter gradients are zeros
      for (void* grad : {args.grad_weight, args.grad_bias}) {
        if (grad != nullptr) {
          cuda::check(cudaMemsetAsync(grad, 0, sizeof(Acc) * shape.channels, cuda::stream(device)), "group_norm_backward");
        }
      }
      return;
    }
    run<T, BackwardSumsOf, BackwardApply>(device, args, static_cast<T*>(args.dx), {args.x, args.dy, args.dx},
                                          "group_norm_backward");
  });
}

}  // namespace apex::group_norm
