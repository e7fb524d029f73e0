// group_norm: CUDA kernels.
//
// One persistent, cooperative kernel per direction (every block resident, so blocks can wait for
// each other). The data is cut into rounds of whole samples, each small enough to stay in L2:
//   phase A: each block reads its share of the round once, adding partial sums (per group, and
//            backward per channel) into global accumulators, then arrives at the round's counter;
//   phase C: once all blocks have arrived, each block re-reads the same share - from L2 - and
//            writes its outputs.
// Phase A of round k+1 runs before phase C of round k, so when a block waits for round k the
// others arrived long ago: HBM sees the data read once and the outputs written once, as in a copy.
//
// The data is viewed as a matrix of rows x cols (see Plan); a block of (blockDim.x, blockDim.y)
// threads walks "items" (a row's chunk of blockDim.x packs), thread x taking pack x of the chunk.
// NHWC: rows are positions (n, s) and columns channels, so with one chunk per row a thread keeps
// the same channels for good and its per-lane sums only change owner at sample boundaries.
// NCHW: rows are (n, g) groups, Cg * S elements each, so a thread's sums change owner only when
// its row does. Sums are handed over ("flushed") to shared memory when their owner changes and to
// global memory (atomically) once per round.
#include <cooperative_groups.h>

#include <limits>

#include "apex/cuda.cuh"
#include "apex/acc_type.h"
#include "apex/occupancy.cuh"
#include "group_norm.h"
#include "group_norm_math.h"

namespace apex::group_norm {
namespace {

// Bytes a round reads: with the next round's reads and this round's writes in flight too, it stays
// in L2 (50 MB on H100, 40 MB on A100) until phase C re-reads it.
constexpr int64_t kRoundBytes = 6 << 20;
// Threads per block; the packs of a row spread over blockDim.x, rows over blockDim.y. Backward
// keeps twice the per-lane state: blocks of half the threads, two per SM (at most 128 registers
// each; the 16-bit NHWC kernels then spill ~100 bytes to L1, measured with ptxas -v: one block of
// 160 registers would halve the loads in flight instead).
constexpr int kForwardThreads = 512;
constexpr int kBackwardThreads = 256;
constexpr int kBackwardBlocksPerSm = 2;
// Items (16-byte packs) a thread loads before using any: bytes in flight to hide HBM latency.
constexpr int kForwardUnroll = 4;
constexpr int kBackwardUnroll = 4;
// Backward keeps four per-lane terms and four per-lane sums: with 8 lanes (16-bit data in 16-byte
// packs) that spills, so it reads 8-byte packs of 16-bit data (and twice as many of them ahead).
constexpr int kBackwardMaxVec = 4;
// Shared memory for a block's group sums (and backward, channel sums); beyond it, sums go
// straight to global memory.
constexpr int64_t kSharedBytes = 32 << 10;

struct Plan {
  int64_t rows;             // NHWC: N * S positions; NCHW: N * G groups
  int64_t cols;             // NHWC: C channels; NCHW: Cg * S
  int64_t packs;            // kVec-wide packs per row
  int chunks;               // items per row: ceil(packs / blockDim.x)
  int rows_per_sample;      // NHWC: S; NCHW: G
  int step_rows;            // blockDim.y items advance a thread this many rows ...
  int step_chunks;          // ... and chunks
  int64_t samples_per_round;
  int64_t rounds;
  int64_t shared_gids;      // group sums a block keeps in shared memory (0: none, global atomics)
  int64_t shared_channels;  // channel sums likewise (backward)
};

// The items [begin, end) (counted from the round's first) that a block handles in a round. A round
// starts at a sample boundary: its first row and sample.
struct Share {
  int64_t first_row, first_sample;
  int begin, end;
};

C10_DEVICE Share share_of(const Plan& p, int64_t round, int64_t samples) {
  const int64_t first_sample = round * p.samples_per_round;
  const int64_t rows = (std::min<int64_t>(samples, first_sample + p.samples_per_round) - first_sample) * p.rows_per_sample;
  const int items = static_cast<int>(rows * p.chunks);
  const int per_block = (items + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  const int begin = std::min(items, static_cast<int>(blockIdx.x) * per_block);
  return {first_sample * p.rows_per_sample, first_sample, begin, std::min(items, begin + per_block)};
}

// Where a thread is in the round (32-bit, counted from the round's start: registers are scarce):
// its current item, the item's row (with the row's sample and place in it) and chunk.
struct Cursor {
  int item, row, chunk, sample, row_in_sample;

  Cursor() = default;
  C10_DEVICE Cursor(const Plan& p, int first)
      : item(first), row(first / p.chunks), chunk(first % p.chunks), sample(row / p.rows_per_sample),
        row_in_sample(row % p.rows_per_sample) {}

  C10_DEVICE int64_t pack() const { return static_cast<int64_t>(chunk) * blockDim.x + threadIdx.x; }

  // To the thread's next item, blockDim.y items on, without a division unless samples are tiny.
  C10_DEVICE void next(const Plan& p) {
    item += blockDim.y;
    chunk += p.step_chunks;
    int rows = p.step_rows;
    if (chunk >= p.chunks) chunk -= p.chunks, ++rows;
    row += rows;
    row_in_sample += rows;
    if (row_in_sample >= p.rows_per_sample) {
      if (rows < p.rows_per_sample) {
        row_in_sample -= p.rows_per_sample, ++sample;
      } else {
        sample += row_in_sample / p.rows_per_sample;
        row_in_sample %= p.rows_per_sample;
      }
    }
  }
};

// A thread's current item in absolute terms, as the phases use it.
struct Item {
  int64_t row, sample, row_in_sample, pack, chunk;
};

C10_DEVICE Item item_of(const Cursor& c, const Share& share) {
  return {share.first_row + c.row, share.first_sample + c.sample, c.row_in_sample, c.pack(), c.chunk};
}

// Group ids (n * G + g) of this block's share: [first, first + count).
struct GidRange {
  int64_t first, count;
};

template <Layout kLayout>
C10_DEVICE GidRange gid_range(const Plan& p, const Shape& shape, Share share) {
  if (share.begin >= share.end) return {0, 0};
  const int64_t first_row = share.first_row + share.begin / p.chunks;
  const int64_t last_row = share.first_row + (share.end - 1) / p.chunks;
  if constexpr (kLayout == Layout::kNhwc) {
    const int64_t first = first_row / p.rows_per_sample, last = last_row / p.rows_per_sample;
    return {first * shape.groups, (last - first + 1) * shape.groups};
  } else {
    return {first_row, last_row - first_row + 1};
  }
}

// Per-lane facts of a thread's current item that only change with its owner key.
template <Layout kLayout, int kVec>
struct Lanes {
  int64_t key = -1;    // NHWC: sample * chunks + chunk (it fixes the lanes' channels and groups); NCHW: row
  int64_t gid0 = 0;    // group id (n * G + g) of lane 0; lane k's is gid0 + step[k]
  int64_t channel0;    // NHWC: channel of lane 0 (lane k: channel0 + k); NCHW: unused
  int step[kVec];

  C10_DEVICE static int64_t key_of(const Item& c, const Plan& p) {
    if constexpr (kLayout == Layout::kNhwc) return c.sample * p.chunks + c.chunk;
    return c.row;
  }

  C10_DEVICE int64_t gid(int k) const { return gid0 + step[k]; }

  C10_DEVICE void reset(int64_t new_key, const Item& c, const Shape& shape, int64_t per_group) {
    key = new_key;
    if constexpr (kLayout == Layout::kNhwc) {
      channel0 = c.pack * kVec;
      const int64_t group0 = channel0 / per_group;
      gid0 = c.sample * shape.groups + group0;
#pragma unroll
      for (int k = 0; k < kVec; ++k) step[k] = static_cast<int>((channel0 + k) / per_group - group0);
    } else {
      gid0 = c.row;
#pragma unroll
      for (int k = 0; k < kVec; ++k) step[k] = 0;
    }
  }
};

// The channel of a pack's lanes in NCHW (one channel per pack: S is a multiple of kVec).
C10_DEVICE int64_t nchw_channel(const Item& c, const Shape& shape, int64_t per_group, int64_t col) {
  return c.row_in_sample * per_group + col / shape.spatial;
}

// The first element of group `gid`: every block shifts that group's sums by the same value.
template <Layout kLayout, class T>
C10_DEVICE T group_shift(const T* x, const Shape& shape, int64_t per_group, int64_t gid) {
  const int64_t n = gid / shape.groups, g = gid % shape.groups;
  if constexpr (kLayout == Layout::kNhwc) return x[n * shape.spatial * shape.channels + g * per_group];
  return x[gid * per_group * shape.spatial];
}

// Adds (a, b) into the pair of sums of `index`: in shared memory when the block keeps them there,
// else globally.
template <class Acc>
C10_DEVICE void add_pair(Acc* shared, int64_t shared_index, Acc* global, int64_t global_index, Acc a, Acc b) {
  if (shared != nullptr) {
    atomicAdd(shared + 2 * shared_index, a);
    atomicAdd(shared + 2 * shared_index + 1, b);
  } else {
    atomicAdd(global + 2 * global_index, a);
    atomicAdd(global + 2 * global_index + 1, b);
  }
}

// Hands per-lane pairs of sums (a[k], b[k]) of ids first_id + step[k] over, adding lanes of one id
// together first (steps never decrease), and zeroes them.
template <int kVec, class Acc>
C10_DEVICE void flush_lanes(int64_t first_id, const int (&step)[kVec], Acc (&a)[kVec], Acc (&b)[kVec], Acc* shared,
                            int64_t shared_first, Acc* global) {
  Acc run_a = a[0], run_b = b[0];
#pragma unroll
  for (int k = 1; k <= kVec; ++k) {
    if (k == kVec || step[k] != step[k - 1]) {
      const int64_t id = first_id + step[k - 1];
      if (run_a != Acc(0) || run_b != Acc(0)) add_pair(shared, id - shared_first, global, id, run_a, run_b);
      if (k < kVec) run_a = a[k], run_b = b[k];
    } else {
      run_a += a[k];
      run_b += b[k];
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) a[k] = b[k] = Acc(0);
}

// Adds the block's shared sums [0, count) pairs into global[first...], and zeroes them for reuse.
template <class Acc>
C10_DEVICE void publish(Acc* shared, int64_t count, Acc* global, int64_t first) {
  __syncthreads();
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, threads = blockDim.x * blockDim.y;
  for (int64_t i = tid; i < 2 * count; i += threads) {
    if (shared[i] != Acc(0)) atomicAdd(global + 2 * first + i, shared[i]);
    shared[i] = Acc(0);
  }
  __syncthreads();
}

// Shared memory starts undefined: zero the block's sums once (publish re-zeroes what it hands over).
template <class Acc>
C10_DEVICE void zero_shared(Acc* shared, int64_t count) {
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, threads = blockDim.x * blockDim.y;
  for (int64_t i = tid; i < count; i += threads) shared[i] = Acc(0);
  __syncthreads();
}

// The block's shared group sums for `range`, or null (global atomics) where it does not fit.
template <class Acc>
C10_DEVICE Acc* shared_for(Acc* shared, const GidRange& range, const Plan& p) {
  return range.count <= p.shared_gids ? shared : nullptr;
}

// Round barrier: counter[round] counts arrived blocks.
C10_DEVICE void arrive(int* counters, int64_t round) {
  __threadfence();  // this thread's atomics are visible device-wide before the count says so
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) atomicAdd(counters + round, 1);
}

C10_DEVICE void wait_for(int* counters, int64_t round) {
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    volatile int* counter = counters + round;
    while (*counter < static_cast<int>(gridDim.x)) {
#if !defined(USE_ROCM)
      __nanosleep(64);
#endif
    }
    __threadfence();
  }
  __syncthreads();
}

// Loads kUnroll items' packs of every input ahead, then calls f(cursor, packs) for each (the
// cursor is stepped again for the calls rather than kept per item: registers are scarce).
template <int kUnroll, int kVec, int kInputs, class T, class F>
C10_DEVICE void walk(const Plan& p, const Share& share, const T* const (&inputs)[kInputs], F&& f) {
  using Pack = AlignedVector<T, kVec>;
  if (share.begin + static_cast<int>(threadIdx.y) >= share.end) return;
  const int64_t offset0 = share.first_row * p.cols;  // the round's first element
  Cursor cursor(p, share.begin + threadIdx.y);
  while (cursor.item < share.end) {
    const Cursor first = cursor;
    Pack packs[kUnroll][kInputs];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (cursor.item < share.end && cursor.pack() < p.packs) {
        const int64_t offset = offset0 + cursor.row * p.cols + cursor.pack() * kVec;
#pragma unroll
        for (int i = 0; i < kInputs; ++i) packs[u][i] = load_vector<kVec>(inputs[i], offset);
      }
      cursor.next(p);
    }
    cursor = first;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (cursor.item < share.end && cursor.pack() < p.packs) f(item_of(cursor, share), packs[u]);
      cursor.next(p);
    }
  }
}

template <class Acc>
struct Workspace {
  Acc* group_sums;    // [N * G, 2]
  Acc* channel_sums;  // [C, 2] (backward)
  int* counters;      // [rounds]
};

template <class Acc>
C10_HOST_DEVICE Workspace<Acc> carve(void* workspace, const Shape& shape, bool backward) {
  Acc* sums = static_cast<Acc*>(workspace);
  Acc* channel_sums = sums + 2 * shape.samples * shape.groups;
  int* counters = reinterpret_cast<int*>(channel_sums + (backward ? 2 * shape.channels : 0));
  return {sums, channel_sums, counters};
}

template <class Acc>
C10_DEVICE Acc param(const Acc* p, int64_t c, Acc absent) {
  return p == nullptr ? absent : p[c];
}

// ---- forward -------------------------------------------------------------------------------

template <class T, int kVec, Layout kLayout>
__global__ void __launch_bounds__(kForwardThreads) forward_kernel(ForwardArgs a, Plan p) {
  using Acc = acc_type<T>;
  using Pack = AlignedVector<T, kVec>;
  extern __shared__ unsigned char shared_bytes[];
  Acc* shared = p.shared_gids > 0 ? reinterpret_cast<Acc*>(shared_bytes) : nullptr;
  const Shape& shape = a.shape;
  const int64_t per_group = shape.channels / shape.groups;
  const Acc count = static_cast<Acc>(per_group * shape.spatial);
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const Acc* weight = static_cast<const Acc*>(a.weight);
  const Acc* bias = static_cast<const Acc*>(a.bias);
  const Workspace<Acc> ws = carve<Acc>(a.workspace, shape, false);
  const T* const inputs[1] = {x};

  const auto phase_a = [&](int64_t round) {
    const Share share = share_of(p, round, shape.samples);
    const GidRange range = gid_range<kLayout>(p, shape, share);
    Acc* const block_sums = shared_for(shared, range, p);
    Lanes<kLayout, kVec> lanes;
    Acc shift[kVec], sum[kVec], squares[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum[k] = squares[k] = Acc(0);
    walk<kForwardUnroll, kVec>(p, share, inputs, [&](const Item& c, const Pack (&packs)[1]) {
      const int64_t key = Lanes<kLayout, kVec>::key_of(c, p);
      if (key != lanes.key) {
        if (lanes.key >= 0) flush_lanes(lanes.gid0, lanes.step, sum, squares, block_sums, range.first, ws.group_sums);
        lanes.reset(key, c, shape, per_group);
#pragma unroll
        for (int k = 0; k < kVec; ++k) shift[k] = static_cast<Acc>(group_shift<kLayout>(x, shape, per_group, lanes.gid(k)));
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const Acc d = static_cast<Acc>(packs[0].value[k]) - shift[k];
        sum[k] += d;
        squares[k] += d * d;
      }
    });
    if (lanes.key >= 0) flush_lanes(lanes.gid0, lanes.step, sum, squares, block_sums, range.first, ws.group_sums);
    if (block_sums != nullptr) publish(block_sums, range.count, ws.group_sums, range.first);
    arrive(ws.counters, round);
  };

  const auto moments_of = [&](int64_t gid) {
    const Acc shift = static_cast<Acc>(group_shift<kLayout>(x, shape, per_group, gid));
    return moments(__ldcg(ws.group_sums + 2 * gid), __ldcg(ws.group_sums + 2 * gid + 1), shift, count, a.eps);
  };

  const auto phase_c = [&](int64_t round) {
    const Share share = share_of(p, round, shape.samples);
    Lanes<kLayout, kVec> lanes;
    Acc scale[kVec], offset[kVec];  // y = act(x * scale + offset)
    Moments<Acc> row_moments{0, 0};  // NCHW: the row's group
    walk<kForwardUnroll, kVec>(p, share, inputs, [&](const Item& c, const Pack (&packs)[1]) {
      const int64_t key = Lanes<kLayout, kVec>::key_of(c, p);
      if (key != lanes.key) {
        lanes.reset(key, c, shape, per_group);
        if constexpr (kLayout == Layout::kNhwc) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            const Moments<Acc> m = moments_of(lanes.gid(k));
            scale[k] = m.rstd * param(weight, lanes.channel0 + k, Acc(1));
            offset[k] = param(bias, lanes.channel0 + k, Acc(0)) - m.mean * scale[k];
            // The thread holding a group's first element at the sample's first position writes its moments.
            if (c.row_in_sample == 0 && (lanes.channel0 + k) % per_group == 0) {
              static_cast<Acc*>(a.mean)[lanes.gid(k)] = m.mean;
              static_cast<Acc*>(a.rstd)[lanes.gid(k)] = m.rstd;
            }
          }
        } else {
          row_moments = moments_of(c.row);
          if (c.pack == 0) {
            static_cast<Acc*>(a.mean)[c.row] = row_moments.mean;
            static_cast<Acc*>(a.rstd)[c.row] = row_moments.rstd;
          }
        }
      }
      if constexpr (kLayout == Layout::kNchw) {
        const int64_t channel = nchw_channel(c, shape, per_group, c.pack * kVec);
        const Acc s = row_moments.rstd * param(weight, channel, Acc(1));
        const Acc o = param(bias, channel, Acc(0)) - row_moments.mean * s;
#pragma unroll
        for (int k = 0; k < kVec; ++k) scale[k] = s, offset[k] = o;
      }
      Pack out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        out.value[k] = static_cast<T>(activate(static_cast<Acc>(packs[0].value[k]) * scale[k] + offset[k], a.silu));
      }
      store_vector<kVec>(y, c.row * p.cols + c.pack * kVec, out);
    });
  };

  if (shared != nullptr) zero_shared(shared, 2 * p.shared_gids);
  phase_a(0);
  for (int64_t round = 0; round < p.rounds; ++round) {
    if (round + 1 < p.rounds) phase_a(round + 1);
    wait_for(ws.counters, round);
    phase_c(round);
  }
}

// ---- backward ------------------------------------------------------------------------------

template <class T, int kVec, Layout kLayout>
__global__ void __launch_bounds__(kBackwardThreads, kBackwardBlocksPerSm) backward_kernel(BackwardArgs a, Plan p) {
  using Acc = acc_type<T>;
  using Pack = AlignedVector<T, kVec>;
  extern __shared__ unsigned char shared_bytes[];
  Acc* shared_groups = p.shared_gids > 0 ? reinterpret_cast<Acc*>(shared_bytes) : nullptr;
  Acc* shared_channels = p.shared_channels > 0 ? reinterpret_cast<Acc*>(shared_bytes) + 2 * p.shared_gids : nullptr;
  const Shape& shape = a.shape;
  const int64_t per_group = shape.channels / shape.groups;
  const Acc count = static_cast<Acc>(per_group * shape.spatial);
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  T* dx = static_cast<T*>(a.dx);
  const Acc* weight = static_cast<const Acc*>(a.weight);
  const Acc* bias = static_cast<const Acc*>(a.bias);
  const Acc* means = static_cast<const Acc*>(a.mean);
  const Acc* rstds = static_cast<const Acc*>(a.rstd);
  const Workspace<Acc> ws = carve<Acc>(a.workspace, shape, true);
  const T* const inputs[2] = {x, dy};

  // Per lane: xhat = x * rstd + shift, z = xhat * w + b (NCHW: every lane of a pack alike).
  struct Terms {
    Acc rstd[kVec], shift[kVec], w[kVec], b[kVec];
    int64_t channel = -1;  // NHWC: of lane 0 (lane k: + k); NCHW: of every lane
  };
  // Brings lanes and terms up to cursor c; true when the owner key changed (after `on_new_key`,
  // which sees the old lanes, e.g. to flush their sums).
  const auto refresh = [&](Lanes<kLayout, kVec>& lanes, Terms& t, const Item& c, auto&& on_new_key) {
    const int64_t key = Lanes<kLayout, kVec>::key_of(c, p);
    const bool new_key = key != lanes.key;
    if (new_key) {
      on_new_key();
      lanes.reset(key, c, shape, per_group);
    }
    const int64_t channel = kLayout == Layout::kNhwc ? lanes.channel0 : nchw_channel(c, shape, per_group, c.pack * kVec);
    if (new_key || channel != t.channel) {
      t.channel = channel;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const int64_t gid = lanes.gid(k), lane_channel = kLayout == Layout::kNhwc ? channel + k : channel;
        t.rstd[k] = rstds[gid];
        t.shift[k] = -means[gid] * t.rstd[k];
        t.w[k] = param(weight, lane_channel, Acc(1));
        t.b[k] = param(bias, lane_channel, Acc(0));
      }
    }
    return new_key;
  };
  const auto dz_of = [&](const Terms& t, int k, Acc xhat, T dy_value) {
    return static_cast<Acc>(dy_value) * activation_slope(xhat * t.w[k] + t.b[k], a.silu);
  };

  // Channel sums (of dz * xhat and of dz) per lane, for the channels of channel_owner.
  constexpr int kChannelSteps[kVec] = {};
  int channel_step[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) channel_step[k] = kLayout == Layout::kNhwc ? k : kChannelSteps[k];
  Acc channel_dw[kVec], channel_db[kVec];
  int64_t channel_owner = -1;
#pragma unroll
  for (int k = 0; k < kVec; ++k) channel_dw[k] = channel_db[k] = Acc(0);

  const auto phase_a = [&](int64_t round) {
    const Share share = share_of(p, round, shape.samples);
    const GidRange range = gid_range<kLayout>(p, shape, share);
    Acc* const block_sums = shared_for(shared_groups, range, p);
    Lanes<kLayout, kVec> lanes;
    Terms t;
    Acc weighted[kVec], weighted_xhat[kVec];  // sums of w * dz and w * dz * xhat
#pragma unroll
    for (int k = 0; k < kVec; ++k) weighted[k] = weighted_xhat[k] = Acc(0);
    const auto flush_groups = [&] {
      if (lanes.key >= 0) flush_lanes(lanes.gid0, lanes.step, weighted, weighted_xhat, block_sums, range.first, ws.group_sums);
    };
    walk<kBackwardUnroll, kVec>(p, share, inputs, [&](const Item& c, const Pack (&packs)[2]) {
      refresh(lanes, t, c, flush_groups);
      if (t.channel != channel_owner) {
        if (channel_owner >= 0) flush_lanes(channel_owner, channel_step, channel_dw, channel_db, shared_channels, 0, ws.channel_sums);
        channel_owner = t.channel;
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const Acc xhat = static_cast<Acc>(packs[0].value[k]) * t.rstd[k] + t.shift[k];
        const Acc dz = dz_of(t, k, xhat, packs[1].value[k]);
        weighted[k] += t.w[k] * dz;
        weighted_xhat[k] += t.w[k] * dz * xhat;
        channel_dw[k] += dz * xhat;
        channel_db[k] += dz;
      }
    });
    flush_groups();
    if (channel_owner >= 0) flush_lanes(channel_owner, channel_step, channel_dw, channel_db, shared_channels, 0, ws.channel_sums);
    if (block_sums != nullptr) publish(block_sums, range.count, ws.group_sums, range.first);
    arrive(ws.counters, round);
  };

  const auto phase_c = [&](int64_t round) {
    const Share share = share_of(p, round, shape.samples);
    Lanes<kLayout, kVec> lanes;
    Terms t;
    Acc c1[kVec], c2[kVec];  // per lane: group means of w * dz and of w * dz * xhat
    walk<kBackwardUnroll, kVec>(p, share, inputs, [&](const Item& c, const Pack (&packs)[2]) {
      if (refresh(lanes, t, c, [] {})) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          c1[k] = __ldcg(ws.group_sums + 2 * lanes.gid(k)) / count;
          c2[k] = __ldcg(ws.group_sums + 2 * lanes.gid(k) + 1) / count;
        }
      }
      Pack out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const Acc xhat = static_cast<Acc>(packs[0].value[k]) * t.rstd[k] + t.shift[k];
        const Acc dz = dz_of(t, k, xhat, packs[1].value[k]);
        out.value[k] = static_cast<T>(t.rstd[k] * (t.w[k] * dz - c1[k] - xhat * c2[k]));
      }
      store_vector<kVec>(dx, c.row * p.cols + c.pack * kVec, out);
    });
  };

  zero_shared(reinterpret_cast<Acc*>(shared_bytes), 2 * (p.shared_gids + p.shared_channels));
  phase_a(0);
  for (int64_t round = 0; round < p.rounds; ++round) {
    if (round + 1 < p.rounds) phase_a(round + 1);
    wait_for(ws.counters, round);
    phase_c(round);
  }
  if (shared_channels != nullptr) publish(shared_channels, shape.channels, ws.channel_sums, 0);
}

// Channel sums out of the workspace into grad_weight / grad_bias (Acc, [C]).
template <class Acc>
__global__ void channel_grads_kernel(const Acc* channel_sums, int64_t channels, Acc* grad_weight, Acc* grad_bias) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < channels;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (grad_weight != nullptr) grad_weight[c] = channel_sums[2 * c];
    if (grad_bias != nullptr) grad_bias[c] = channel_sums[2 * c + 1];
  }
}

// ---- host ----------------------------------------------------------------------------------

template <class T, int kVec>
int vector_width_for(const Shape& shape, const void* const* pointers, int count) {
  const int64_t row = shape.layout == Layout::kNhwc ? shape.channels : shape.spatial;
  bool aligned = row % kVec == 0;
  for (int i = 0; i < count; ++i) aligned = aligned && (pointers[i] == nullptr || is_aligned(pointers[i]));
  return aligned ? kVec : 1;
}

Plan plan_for(const Shape& shape, int vec, int64_t element_bytes, int inputs, dim3& block, int threads) {
  Plan p{};
  const int64_t per_group = shape.channels / shape.groups;
  if (shape.layout == Layout::kNhwc) {
    p.rows = shape.samples * shape.spatial, p.cols = shape.channels, p.rows_per_sample = shape.spatial;
  } else {
    p.rows = shape.samples * shape.groups, p.cols = per_group * shape.spatial, p.rows_per_sample = shape.groups;
  }
  p.packs = p.cols / vec;
  block.x = static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(p.packs, 1), threads));
  block.y = static_cast<unsigned>(std::max<int64_t>(1, threads / block.x));
  block.z = 1;
  p.chunks = std::max<int64_t>(1, (p.packs + block.x - 1) / block.x);
  p.step_rows = block.y / p.chunks;
  p.step_chunks = block.y % p.chunks;
  const int64_t sample_bytes = std::max<int64_t>(1, shape.channels * shape.spatial * element_bytes * inputs);
  p.samples_per_round = std::max<int64_t>(1, kRoundBytes / sample_bytes);
  p.rounds = (shape.samples + p.samples_per_round - 1) / p.samples_per_round;
  return p;
}

// The block's shared sums: group ids its share can span, and (backward) every channel; zero
// where they do not fit (sums then go to global memory directly).
void size_shared(Plan& p, const Shape& shape, int64_t grid, int64_t acc_bytes, bool backward) {
  const int64_t items = p.samples_per_round * p.rows_per_sample * p.chunks;
  const int64_t rows_spanned = (items + grid - 1) / grid / p.chunks + 2;
  const int64_t gids = shape.layout == Layout::kNhwc
                           ? (rows_spanned / p.rows_per_sample + 2) * shape.groups
                           : rows_spanned;
  const int64_t pair = 2 * acc_bytes;
  p.shared_channels = backward && shape.channels * pair <= kSharedBytes / 2 ? shape.channels : 0;
  const int64_t left = kSharedBytes - p.shared_channels * pair;
  p.shared_gids = std::min(gids, shape.samples * shape.groups) * pair <= left ? std::min(gids, shape.samples * shape.groups) : 0;
}

template <class Kernel, class Args>
void launch_cooperative(Kernel kernel, const Args& args, Plan& p, const Shape& shape, dim3 block, int64_t acc_bytes,
                        bool backward, const Cuda& device, const char* op) {
  // Shared sums are sized after the grid, the grid after their size: size them for the largest
  // grid first (per_sm with the most shared memory), which only shrinks their need.
  const int per_sm = cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel),
                                                  static_cast<int>(block.x * block.y), kSharedBytes, device.device);
  const int64_t grid = std::max<int64_t>(1, static_cast<int64_t>(per_sm) * cuda::sm_count(device.device));
  size_shared(p, shape, grid, acc_bytes, backward);
  const size_t shared = static_cast<size_t>((2 * p.shared_gids + 2 * p.shared_channels) * acc_bytes);
  Args kernel_args = args;
  Plan kernel_plan = p;
  void* params[] = {&kernel_args, &kernel_plan};
  const cudaError_t error = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(static_cast<unsigned>(grid)),
                                                        block, params, shared, cuda::stream(device));
  if (error != cudaSuccess) throw std::runtime_error(std::string(op) + ": CUDA error: " + cudaGetErrorString(error));
}

template <class T, Layout kLayout, int kVec>
void forward_launch(const Cuda& device, const ForwardArgs& args, Plan p, dim3 block) {
  launch_cooperative(forward_kernel<T, kVec, kLayout>, args, p, args.shape, block, sizeof(acc_type<T>), false, device,
                     "group_norm_forward");
}

template <class T, Layout kLayout, int kVec>
void backward_launch(const Cuda& device, const BackwardArgs& args, Plan p, dim3 block) {
  launch_cooperative(backward_kernel<T, kVec, kLayout>, args, p, args.shape, block, sizeof(acc_type<T>), true, device,
                     "group_norm_backward");
}

// Calls f(Layout constant, vector width constant) for the shape's layout and the width `vec`
// (kVec or 1).
template <int kVec, class F>
void dispatch_layout_vec(const Shape& shape, int vec, F&& f) {
  const auto with_layout = [&](auto layout) {
    if (vec == kVec) {
      f(layout, std::integral_constant<int, kVec>{});
    } else {
      f(layout, std::integral_constant<int, 1>{});
    }
  };
  if (shape.layout == Layout::kNhwc) {
    with_layout(std::integral_constant<Layout, Layout::kNhwc>{});
  } else {
    with_layout(std::integral_constant<Layout, Layout::kNchw>{});
  }
}

}  // namespace

int64_t workspace_bytes(const Cuda&, const Shape& shape, Dtype dtype, bool backward) {
  const int64_t acc = dtype == Dtype::kFloat64 ? 8 : 4;
  const int64_t rounds = std::max<int64_t>(shape.samples, 1);  // at most one round per sample
  return acc * 2 * (shape.samples * shape.groups + (backward ? shape.channels : 0)) + 4 * rounds;
}

void forward(const Cuda& device, const ForwardArgs& args) {
  const Shape& shape = args.shape;
  if (shape.samples == 0 || shape.channels == 0 || shape.spatial == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vector_width<T>();
    const void* pointers[] = {args.x, args.y};
    const int vec = vector_width_for<T, kVec>(shape, pointers, 2);
    dim3 block;
    const Plan p = plan_for(shape, vec, sizeof(T), 1, block, kForwardThreads);
    dispatch_layout_vec<kVec>(shape, vec, [&](auto layout, auto width) {
      forward_launch<T, decltype(layout)::value, decltype(width)::value>(device, args, p, block);
    });
  });
  cuda::check_launch("group_norm_forward");
}

void backward(const Cuda& device, const BackwardArgs& args) {
  const Shape& shape = args.shape;
  if (shape.channels == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_type<T>;
    if (shape.samples > 0 && shape.spatial > 0) {
      constexpr int kVec = std::min(vector_width<T>(), kBackwardMaxVec);
      const void* pointers[] = {args.x, args.dy, args.dx};
      const int vec = vector_width_for<T, kVec>(shape, pointers, 3);
      dim3 block;
      const Plan p = plan_for(shape, vec, sizeof(T), 2, block, kBackwardThreads);
      dispatch_layout_vec<kVec>(shape, vec, [&](auto layout, auto width) {
        backward_launch<T, decltype(layout)::value, decltype(width)::value>(device, args, p, block);
      });
    }
    if (args.grad_weight != nullptr || args.grad_bias != nullptr) {
      const Workspace<Acc> ws = carve<Acc>(args.workspace, shape, true);
      const unsigned blocks = cuda::grid_size(shape.channels, 256, 4, device);
      channel_grads_kernel<Acc><<<blocks, 256, 0, cuda::stream(device)>>>(
          ws.channel_sums, shape.channels, static_cast<Acc*>(args.grad_weight), static_cast<Acc*>(args.grad_bias));
    }
  });
  cuda::check_launch("group_norm_backward");
}

}  // namespace apex::group_norm
