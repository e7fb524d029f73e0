#pragma once
// Device helpers and launch-shape choices shared by the LayerNorm / RMSNorm CUDA kernels.
#include <cstdint>
#include <optional>
#include <type_traits>

#include "apex/cuda.cuh"
#include "apex/dependent_launch.cuh"
#include "apex/occupancy.cuh"
#include "layer_norm.h"
#include "layer_norm_math.h"

namespace apex::layer_norm {

// The forward, the register-resident backwards and sum_partial_rows start as programmatic dependent
// launches (cuda::launch_dependent, each kernel opening with cuda::start_dependent_kernel): their
// blocks take SMs as the previous kernel's retire, instead of after a launch gap and a ramp. On an
// H200 (session 30, bf16, against ordinary launches) the forward gained most at 32768x1024, ~37 us a
// call, where the gap weighs most (LayerNorm 3671 -> 3823 GB/s, RMSNorm 3716 -> 3872) and 1-3% at the
// other shapes; fwd+bwd moved -2% to +2% (benchmarks/normalization/NOTES.md).

// Threads per block the launchers aim for: several blocks per SM, so one block's
// reductions overlap another's loads.
constexpr int kBlockThreads = 256;
constexpr int kMaxThreads = 1024;
// Register-resident kernels: at most this many threads per row (so up to 128 registers per
// thread, room for 8 vectors of a row, and two blocks of a wide row fit on an SM).
constexpr int kMaxRegisterRowThreads = 512;
constexpr int kMaxWarps = kMaxThreads / C10_WARP_SIZE;

template <typename A>
__device__ __forceinline__ A shuffle_xor(A value, int lane_mask) {
#if defined(USE_ROCM)
  return __shfl_xor(value, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
#endif
}

// Sums K values over the blockDim.x threads that share one row (threadIdx.y picks the row);
// every thread of the row gets the totals. Must be reached by every thread of the block.
template <int K, typename A>
__device__ __forceinline__ void row_sum(A (&v)[K], A* scratch /* >= kMaxWarps * K */) {
  const int width = blockDim.x < C10_WARP_SIZE ? blockDim.x : C10_WARP_SIZE;
  for (int offset = width / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] += shuffle_xor(v[k], offset);
  }
  if (blockDim.x <= C10_WARP_SIZE) return;
  const int warps = blockDim.x / C10_WARP_SIZE;
  const int lane = threadIdx.x % C10_WARP_SIZE;
  A* row_scratch = scratch + threadIdx.y * warps * K;
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) row_scratch[(threadIdx.x / C10_WARP_SIZE) * K + k] = v[k];
  }
  __syncthreads();
  // Every warp folds the per-warp totals itself (lane w takes warp w's): two registers per value,
  // where a loop over the warps' totals would keep them all in registers at once.
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = lane < warps ? row_scratch[lane * K + k] : A(0);
  for (int offset = C10_WARP_SIZE / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] += shuffle_xor(v[k], offset);
  }
  __syncthreads();  // the scratch is reused by the next call
}

// Columns folded per block by column_sum: threads (kFoldColumns, kFoldRows).
constexpr int kFoldColumns = C10_WARP_SIZE;
constexpr int kFoldRows = 16;

// Sums `value` over threadIdx.y of a (kFoldColumns, kFoldRows) block; the total lands in threadIdx.y == 0.
template <typename A>
__device__ __forceinline__ A column_sum(A value) {
  __shared__ A fold[kFoldRows][kFoldColumns + 1];  // +1: no bank conflicts on the transposed read
  fold[threadIdx.y][threadIdx.x] = value;
  __syncthreads();
  A total = A(0);
  if (threadIdx.y == 0) {
    for (int r = 0; r < kFoldRows; ++r) total += fold[r][threadIdx.x];
  }
  return total;
}

// How the 16-byte vectors of one row are spread over a block.
struct RowLayout {
  int items;            // vectors each thread keeps in registers
  int threads_per_row;  // blockDim.x: a power of two up to a warp, else whole warps
  int rows_per_block;   // blockDim.y
};

// Register-resident layout for rows of `vecs` vectors, or nullopt if a row needs more than
// max_items vectors (at most 8) on each of max_threads_per_row threads. Aims at target_items
// vectors per thread (several loads in flight each) once a row fills a warp.
inline std::optional<RowLayout> register_layout(int64_t vecs, int warp, int max_threads_per_row, int max_items = 8,
                                                int target_items = 4) {
  for (int items : {1, 2, 4, 8}) {
    if (items > max_items) break;
    if (items < target_items && vecs > int64_t(items) * warp) continue;
    int64_t threads = (vecs + items - 1) / items;
    if (threads <= warp) {
      int pow2 = 1;
      while (pow2 < threads) pow2 *= 2;
      threads = pow2;
    } else {
      threads = (threads + warp - 1) / warp * warp;
    }
    if (threads > max_threads_per_row) continue;
    const int t = static_cast<int>(threads);
    return RowLayout{items, t, std::max(1, kBlockThreads / t)};
  }
  return std::nullopt;
}

// Layout of the scalar "streaming" kernels (any width, any alignment): whole warps per row,
// up to a block per row for wide rows.
inline RowLayout streaming_layout(int64_t cols, int warp) {
  int threads = warp;
  while (threads < kBlockThreads && threads * 8 < cols) threads *= 2;
  return RowLayout{1, threads, std::max(1, kBlockThreads / threads)};
}

// Calls f(std::integral_constant<int, items>{}) for items in {1, 2, 4, 8}.
template <typename F>
void dispatch_items(int items, F&& f) {
  switch (items) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

// Calls f(std::true_type{}) or f(std::false_type{}).
template <typename F>
void dispatch_bool(bool value, F&& f) {
  if (value) return f(std::true_type{});
  return f(std::false_type{});
}

// The forward for data type T and parameter type W (layer_norm_forward.cuh).
template <class T, class W>
void forward_typed(const Cuda& device, const ForwardArgs& args);

// The backward for data type T, parameter type W and RMSNorm or LayerNorm (layer_norm_backward.cuh).
template <class T, class W, bool RMS>
void backward_typed(const Cuda& device, const BackwardArgs& args, const Scratch& scratch);

}  // namespace apex::layer_norm
