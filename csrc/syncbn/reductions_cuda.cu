// syncbn CUDA reductions: per-channel Welford statistics (forward) and the
// per-channel gradient sums (backward), for NCHW and channels-last inputs, plus
// the merge of per-rank statistics (welford_parallel).
//
// Every reduction is two launches: blocks reduce disjoint slices of the batch
// into partial states (16-byte loads, thread-local folding, a block merge), then
// one block per channel merges the slices in a fixed order. No atomics, so the
// result is the same on every run.
#include "syncbn_cuda.cuh"
#include "welford.h"

namespace apex::syncbn {
namespace {

constexpr int kThreads = 256;
// Channels-last blocks: kColumns threads across channels, kRows across rows.
constexpr int kColumns = 32;
constexpr int kRows = kThreads / kColumns;
constexpr int64_t kMaxGridY = 65535;

// A Fold tells the reduction kernels what one channel's state folds in.
//   NCHW: fold_same_channel<VEC>(state, offset, channel): VEC consecutive elements of one channel.
//   Channels-last, per thread of VEC consecutive channels:
//     channels<VEC>(first_channel): the per-channel constants the thread keeps in registers;
//     load_row<VEC>(offset): the thread's share of one row (issued early, see kRowsInFlight);
//     fold_row<VEC>(states, channels, row, rows_seen): folds that row into the VEC states.
template <typename T, typename acc_t>
struct WelfordFold {
  using State = WelfordState<acc_t>;
  const T* x;

  // VEC consecutive elements of one channel: their own mean and m2, then one merge
  // (one division per VEC elements instead of one per element). Deviations from the
  // first element are exact for nearby values, so the chunk's statistics stay accurate
  // even when |mean| >> std.
  template <int VEC>
  __device__ void fold_same_channel(State& state, int64_t offset, int64_t) const {
    const auto values = load_vector<VEC>(x, offset);
    const acc_t pivot = acc_t(values.value[0]);
    acc_t sum = 0;
#pragma unroll
    for (int v = 0; v < VEC; ++v) sum += acc_t(values.value[v]) - pivot;
    const acc_t shifted_mean = sum / acc_t(VEC);
    acc_t m2 = 0;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const acc_t d = acc_t(values.value[v]) - pivot - shifted_mean;
      m2 += d * d;
    }
    state.merge({pivot + shifted_mean, m2, VEC});
  }

  template <int VEC>
  struct Channels {};
  template <int VEC>
  using Row = AlignedVector<T, VEC>;

  template <int VEC>
  __device__ Channels<VEC> channels(int64_t) const {
    return {};
  }

  template <int VEC>
  __device__ Row<VEC> load_row(int64_t offset) const {
    return load_vector<VEC>(x, offset);
  }

  // One element of each of VEC consecutive channels; all share the row count.
  template <int VEC>
  __device__ void fold_row(State* states, const Channels<VEC>&, const Row<VEC>& row, int64_t rows_seen) const {
    const acc_t inv_count = acc_t(1) / acc_t(rows_seen + 1);
#pragma unroll
    for (int v = 0; v < VEC; ++v) states[v].push(acc_t(row.value[v]), inv_count);
  }

  __device__ static void set_row_count(State& state, int64_t rows) { state.count = rows; }
};

template <typename T, typename acc_t>
struct GradFold {
  using State = GradSums<acc_t>;
  const T* x;
  const T* dy;
  const acc_t* mean;

  template <int VEC>
  __device__ void fold_same_channel(State& state, int64_t offset, int64_t channel) const {
    const auto xs = load_vector<VEC>(x, offset);
    const auto dys = load_vector<VEC>(dy, offset);
    const acc_t mu = mean[channel];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      state.sum_dy += acc_t(dys.value[v]);
      state.sum_dy_xmu += acc_t(dys.value[v]) * (acc_t(xs.value[v]) - mu);
    }
  }

  // The thread's channel means, read once rather than once per row.
  template <int VEC>
  struct Channels {
    acc_t mean[VEC];
  };
  template <int VEC>
  struct Row {
    AlignedVector<T, VEC> x, dy;
  };

  template <int VEC>
  __device__ Channels<VEC> channels(int64_t first_channel) const {
    Channels<VEC> result;
#pragma unroll
    for (int v = 0; v < VEC; ++v) result.mean[v] = mean[first_channel + v];
    return result;
  }

  template <int VEC>
  __device__ Row<VEC> load_row(int64_t offset) const {
    return {load_vector<VEC>(x, offset), load_vector<VEC>(dy, offset)};
  }

  template <int VEC>
  __device__ void fold_row(State* states, const Channels<VEC>& channels, const Row<VEC>& row, int64_t) const {
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const acc_t dy_v = acc_t(row.dy.value[v]);
      states[v].sum_dy += dy_v;
      states[v].sum_dy_xmu += dy_v * (acc_t(row.x.value[v]) - channels.mean[v]);
    }
  }

  __device__ static void set_row_count(State&, int64_t) {}
};

// NCHW: block (blockIdx.x = slice of the batch, blockIdx.y = channel). Threads form
// [rows][columns]: columns walk a plane's contiguous elements, rows walk the batch.
template <int VEC, typename Fold>
__global__ void __launch_bounds__(kThreads)
    reduce_nchw_kernel(Fold fold, Layout layout, int columns, typename Fold::State* partials) {
  using State = typename Fold::State;
  __shared__ State shared[kThreads];
  const int column = threadIdx.x % columns, row = threadIdx.x / columns, rows = kThreads / columns;
  for (int64_t channel = blockIdx.y; channel < layout.channels; channel += gridDim.y) {
    State state = State::empty();
    for (int64_t o = int64_t(blockIdx.x) * rows + row; o < layout.outer; o += int64_t(gridDim.x) * rows) {
      const int64_t plane = (o * layout.channels + channel) * layout.inner;
      for (int64_t i = int64_t(column) * VEC; i < layout.inner; i += int64_t(columns) * VEC) {
        fold.template fold_same_channel<VEC>(state, plane + i, channel);
      }
    }
    state = merge_columns(state, shared, threadIdx.x, 0, kThreads, 1);
    if (threadIdx.x == 0) partials[blockIdx.x * layout.channels + channel] = state;
    __syncthreads();  // `shared` is reused by the next channel
  }
}

// Channels-last: block (blockIdx.x = group of kColumns * VEC channels, blockIdx.y =
// slice of the rows), threads (x: kColumns, y: kRows); each thread folds VEC channels
// of every kRows-th row of the slice, a warp thus reading contiguous runs of a row.
template <int VEC, typename Fold>
__global__ void __launch_bounds__(kThreads)
    reduce_c_last_kernel(Fold fold, Layout layout, typename Fold::State* partials) {
  using State = typename Fold::State;
  using Row = typename Fold::template Row<VEC>;
  // Every thread's states, [row of threads][v][column]: conflict-free shared stores and loads.
  __shared__ State shared[kRows * VEC * kColumns];
  const int column = threadIdx.x, row = threadIdx.y;
  const int64_t block_channel = int64_t(blockIdx.x) * kColumns * VEC;
  const int64_t first_channel = block_channel + int64_t(column) * VEC;
  State states[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) states[v] = State::empty();
  int64_t rows_seen = 0;
  if (first_channel < layout.channels) {  // VEC divides the channels, so all VEC channels exist
    const auto channels = fold.template channels<VEC>(first_channel);
    const int64_t stride = int64_t(gridDim.y) * kRows;
    for (int64_t r = int64_t(blockIdx.y) * kRows + row; r < layout.outer; r += kRowsInFlight * stride) {
      Row rows[kRowsInFlight];
#pragma unroll
      for (int k = 0; k < kRowsInFlight; ++k) {
        if (r + k * stride < layout.outer) {
          rows[k] = fold.template load_row<VEC>((r + k * stride) * layout.channels + first_channel);
        }
      }
#pragma unroll
      for (int k = 0; k < kRowsInFlight; ++k) {
        if (r + k * stride < layout.outer) fold.template fold_row<VEC>(states, channels, rows[k], rows_seen++);
      }
    }
  }
  // One barrier, then each (v, column) of the block is merged over the kRows rows of
  // threads by one thread, in row order.
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    Fold::set_row_count(states[v], rows_seen);
    shared[(row * VEC + v) * kColumns + column] = states[v];
  }
  __syncthreads();
  for (int i = row * kColumns + column; i < VEC * kColumns; i += kThreads) {
    State merged = shared[i];
    for (int r = 1; r < kRows; ++r) merged.merge(shared[r * VEC * kColumns + i]);
    const int64_t channel = block_channel + int64_t(i % kColumns) * VEC + i / kColumns;
    if (channel < layout.channels) partials[blockIdx.y * layout.channels + channel] = merged;
  }
}

// One block per channel merges the slices' partial states in slice order.
template <typename State, typename Finish>
__global__ void __launch_bounds__(kThreads)
    finish_kernel(const State* partials, int64_t slices, int64_t channels, Finish finish) {
  __shared__ State shared[kThreads];
  for (int64_t channel = blockIdx.x; channel < channels; channel += gridDim.x) {
    State state = State::empty();
    for (int64_t s = threadIdx.x; s < slices; s += kThreads) state.merge(partials[s * channels + channel]);
    state = merge_columns(state, shared, threadIdx.x, 0, kThreads, 1);
    if (threadIdx.x == 0) finish(channel, state);
    __syncthreads();
  }
}

// Per-slice partial states of every channel ([slices][channels]), in the op function's scratch.
template <typename State>
struct Partials {
  State* states;
  int64_t slices;

  static Partials allocate(const Scratch& scratch, int64_t slices, int64_t channels) {
    return {static_cast<State*>(scratch(size_t(slices) * size_t(channels) * sizeof(State))), slices};
  }
};

template <int VEC, typename Fold>
Partials<typename Fold::State> reduce_nchw(const Fold& fold, Layout layout, const Cuda& device,
                                           const Scratch& scratch) {
  using State = typename Fold::State;
  const int columns = std::min(kThreads, next_power_of_two(ceil_div(layout.inner, VEC)));
  const int rows = kThreads / columns;
  const int64_t slices = std::clamp<int64_t>(ceil_div(target_blocks(device), layout.channels), 1,
                                             ceil_div(layout.outer, rows));
  const auto partials = Partials<State>::allocate(scratch, slices, layout.channels);
  const dim3 grid(slices, std::min(layout.channels, kMaxGridY));
  reduce_nchw_kernel<VEC><<<grid, kThreads, 0, cuda::stream(device)>>>(fold, layout, columns, partials.states);
  return partials;
}

template <int VEC, typename Fold>
Partials<typename Fold::State> reduce_c_last(const Fold& fold, Layout layout, const Cuda& device,
                                             const Scratch& scratch) {
  using State = typename Fold::State;
  const auto kernel = reduce_c_last_kernel<VEC, Fold>;
  const int64_t channel_groups = ceil_div(layout.channels, int64_t(kColumns) * VEC);
  // One wave: every thread then folds many rows between its setup and its block merge.
  const int64_t slices = std::clamp<int64_t>(one_wave_blocks(kernel, kThreads, device) / channel_groups, 1,
                                             std::min(kMaxGridY, ceil_div(layout.outer, kRows)));
  const auto partials = Partials<State>::allocate(scratch, slices, layout.channels);
  kernel<<<dim3(channel_groups, slices), dim3(kColumns, kRows), 0, cuda::stream(device)>>>(fold, layout,
                                                                                          partials.states);
  return partials;
}

// Reduces every channel with `fold`, then hands each channel's state to `finish`.
template <typename T, typename Fold, typename Finish>
void reduce_channels(const Fold& fold, bool vector_aligned, Layout layout, const Finish& finish, const Cuda& device,
                     const Scratch& scratch, const char* op) {
  using State = typename Fold::State;
  constexpr int VEC = vector_width<T>();
  Partials<State> partials;
  if (!layout.channels_last()) {
    partials = vector_aligned && layout.inner % VEC == 0 ? reduce_nchw<VEC>(fold, layout, device, scratch)
                                                         : reduce_nchw<1>(fold, layout, device, scratch);
  } else {
    partials = vector_aligned && layout.channels % VEC == 0 ? reduce_c_last<VEC>(fold, layout, device, scratch)
                                                            : reduce_c_last<1>(fold, layout, device, scratch);
  }
  finish_kernel<<<std::min(layout.channels, kMaxGridY), kThreads, 0, cuda::stream(device)>>>(
      partials.states, partials.slices, layout.channels, finish);
  cuda::check_launch(op);
}

// One thread per channel (MergeArgs says what it computes).
template <typename acc_t>
__global__ void welford_parallel_kernel(const acc_t* mean, const acc_t* var_biased, const int64_t* count,
                                        int64_t elements, int64_t world, int64_t channels, acc_t eps, acc_t* out_mean,
                                        acc_t* out_var, acc_t* inv_std, acc_t* running_mean, acc_t* running_var,
                                        acc_t momentum) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < channels; c += int64_t(gridDim.x) * blockDim.x) {
    auto state = WelfordState<acc_t>::empty();
    for (int64_t r = 0; r < world; ++r) {
      const int64_t i = r * channels + c;
      const int64_t n = count ? count[r] : elements;
      state.merge({mean[i], var_biased[i] * acc_t(n), n});
    }
    const acc_t var = state.m2 / acc_t(state.count - 1);
    out_mean[c] = state.mean;
    out_var[c] = var;
    inv_std[c] = acc_t(1) / sqrt(state.biased_var() + eps);
    if (running_mean) running_mean[c] += momentum * (state.mean - running_mean[c]);
    if (running_var) running_var[c] += momentum * (var - running_var[c]);
  }
}

// One thread per channel (InverseStdArgs), welford_parallel_kernel's formula.
template <typename acc_t>
__global__ void inverse_std_kernel(const acc_t* var, int64_t channels, acc_t eps, acc_t* inv_std) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < channels; c += int64_t(gridDim.x) * blockDim.x) {
    inv_std[c] = acc_t(1) / sqrt(var[c] + eps);
  }
}

// Both per-channel kernels: a thread per channel, up to target_blocks blocks (threads then loop).
constexpr int kChannelThreads = 128;
inline int64_t channel_blocks(int64_t channels, const Cuda& device) {
  return std::min<int64_t>(ceil_div(channels, kChannelThreads), target_blocks(device));
}

}  // namespace

void welford_mean_var(const Cuda& device, const StatisticsArgs& a, const Scratch& scratch) {
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_type<T>;
    reduce_channels<T>(WelfordFold<T, A>{static_cast<const T*>(a.input)}, aligned_or_absent(a.input), a.layout,
                       WriteChannelResults<A>{static_cast<A*>(a.mean), static_cast<A*>(a.var_biased)}, device, scratch,
                       "syncbn_welford_mean_var");
  });
}

void reduce_bn(const Cuda& device, const GradSumsArgs& a, const Scratch& scratch) {
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_type<T>;
    const GradFold<T, A> fold{static_cast<const T*>(a.input), static_cast<const T*>(a.grad_output),
                              static_cast<const A*>(a.mean)};
    reduce_channels<T>(fold, aligned_or_absent(a.input) && aligned_or_absent(a.grad_output), a.layout,
                       WriteGradSums<A>{static_cast<A*>(a.sum_dy), static_cast<A*>(a.sum_dy_xmu),
                                        static_cast<const A*>(a.inv_std), static_cast<A*>(a.grad_weight)},
                       device, scratch, "syncbn_reduce_bn");
  });
}

void welford_parallel(const Cuda& device, const MergeArgs& a) {
  const auto merge = [&](auto tag) {
    using A = typename decltype(tag)::type;
    welford_parallel_kernel<<<channel_blocks(a.channels, device), kChannelThreads, 0, cuda::stream(device)>>>(
        static_cast<const A*>(a.mean), static_cast<const A*>(a.var_biased), a.count, a.elements, a.world, a.channels,
        A(a.eps), static_cast<A*>(a.out_mean), static_cast<A*>(a.out_var), static_cast<A*>(a.inv_std),
        static_cast<A*>(a.running_mean), static_cast<A*>(a.running_var), A(a.momentum));
  };
  if (a.dtype == Dtype::kFloat64) {
    merge(Type<double>{});
  } else {
    merge(Type<float>{});
  }
  cuda::check_launch("syncbn_welford_parallel");
}

void inverse_std(const Cuda& device, const InverseStdArgs& a) {
  const auto compute = [&](auto tag) {
    using A = typename decltype(tag)::type;
    inverse_std_kernel<<<channel_blocks(a.channels, device), kChannelThreads, 0, cuda::stream(device)>>>(
        static_cast<const A*>(a.var), a.channels, A(a.eps), static_cast<A*>(a.inv_std));
  };
  if (a.dtype == Dtype::kFloat64) {
    compute(Type<double>{});
  } else {
    compute(Type<float>{});
  }
  cuda::check_launch("syncbn_batch_norm_eval");
}

}  // namespace apex::syncbn
