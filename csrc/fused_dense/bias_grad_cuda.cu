// fused_dense: the activation-and-bias gradient pass (bias_grad.h) on CUDA, in two launches:
//
//   tile_sums_kernel  one block per (tile of kTileRows rows, strip of columns) work item: each thread
//                     owns kVec columns of the strip and every kRowThreads-th row of the tile; it
//                     writes grad_input and keeps its columns' sums in registers; the block adds its
//                     kRowThreads row groups in order in shared memory and writes one workspace row
//                     segment partials[tile, strip].
//   fold_kernel       grad_bias[c] = the tiles' partials[., c] added in a fixed order, rounded to T;
//                     a dependent launch (it starts while the first grid retires and waits for it).
//
// Every addition's place is fixed by the shape and this file's constants, never by the grid size or
// the scheduling, so results are bitwise reproducible (and the same on every GPU model). No atomics.
// The workspace is rows / kTileRows rows of cols acc_t values: 1/128 of the data read, written once
// and read once, mostly from L2.
#include "apex/cuda.cuh"
#include "apex/dependent_launch.cuh"
#include "apex/occupancy.cuh"
#include "bias_grad.h"
#include "dense_math.h"

namespace apex::fused_dense {
namespace {

// Threads across a strip, each with one 16-byte vector of a row: 32 x 16 bytes = 512 contiguous bytes
// of each row per group (four whole 128-byte lines). Not a warp size: nothing here is warp-synchronous.
constexpr int kColumnThreads = 32;
// Threads down a tile; kColumnThreads x kRowThreads = 256 threads a block.
constexpr int kRowThreads = 8;
constexpr int kThreads = kColumnThreads * kRowThreads;
// Rows a thread has loads in flight for at once (grad and saved: 16 bytes each, 64 bytes a thread).
// ptxas (sm_90, 16-bit vectorized) gives this kernel 72-80 registers, 3 blocks a SM: 48 KiB of loads
// in flight per SM, above what an H200 needs of each SM (4.8 TB/s x ~1 us latency / 132 SMs: about
// 36 KiB); 4 rows took 128 registers (2 blocks, fewer warps to hide the GELU derivative's arithmetic).
constexpr int kRowUnroll = 2;
// Rows one block sums into one workspace row: the workspace is 1/kTileRows of the data, and at
// tokens x hidden 8192 x 4096 (bf16: 16 strips x 64 tiles) the grid still fills a 132-SM GPU.
constexpr int kTileRows = 128;
static_assert(kTileRows % (kRowThreads * kRowUnroll) == 0, "a tile is whole unrolled row steps");

// The fold: kFoldColumns consecutive columns per block row (128 contiguous bytes of float per tile),
// kFoldRows threads splitting a column's tiles.
constexpr int kFoldColumns = 32;
constexpr int kFoldRows = 8;

template <class T>
constexpr int strip_width() {
  return kColumnThreads * vector_width<T>();
}

// The strip-local column of value k of thread `lane` (0 <= lane < kColumnThreads): kVectorized, the
// thread's own 16-byte pack of kVec adjacent columns; else column k * kColumnThreads + lane, so that
// each of a thread group's kVec scalar loads reads kColumnThreads adjacent elements (coalesced).
template <int kVec, bool kVectorized>
C10_DEVICE C10_ALWAYS_INLINE int strip_column(int lane, int k) {
  return kVectorized ? lane * kVec + k : k * kColumnThreads + lane;
}

template <int kVec, class T>
struct Pack {
  T value[kVec];
};

// The kVec values of one row a thread owns, from data + row_offset: one 16-byte load (kVectorized),
// else kVec scalar loads; columns at or past cols read as 0.
template <int kVec, bool kVectorized, class T>
C10_DEVICE C10_ALWAYS_INLINE Pack<kVec, T> load_pack(const T* data, int64_t row_offset, int64_t strip_first, int lane,
                                                      int64_t cols) {
  Pack<kVec, T> pack;
  if constexpr (kVectorized) {
    const int64_t c = strip_first + strip_column<kVec, true>(lane, 0);
    if (c < cols) {  // cols % kVec == 0 on this path: a pack is wholly in or out
      const auto vector = load_vector<kVec>(data, row_offset + c);
#pragma unroll
      for (int k = 0; k < kVec; ++k) pack.value[k] = vector.value[k];
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) pack.value[k] = T(0);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t c = strip_first + strip_column<kVec, false>(lane, k);
      pack.value[k] = c < cols ? data[row_offset + c] : T(0);
    }
  }
  return pack;
}

template <int kVec, bool kVectorized, class T>
C10_DEVICE C10_ALWAYS_INLINE void store_pack(T* data, int64_t row_offset, int64_t strip_first, int lane, int64_t cols,
                                             const Pack<kVec, T>& pack) {
  if constexpr (kVectorized) {
    const int64_t c = strip_first + strip_column<kVec, true>(lane, 0);
    if (c < cols) {
      AlignedVector<T, kVec> vector;
#pragma unroll
      for (int k = 0; k < kVec; ++k) vector.value[k] = pack.value[k];
      store_vector<kVec>(data, row_offset + c, vector);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t c = strip_first + strip_column<kVec, false>(lane, k);
      if (c < cols) data[row_offset + c] = pack.value[k];
    }
  }
}

// Work items (tile, strip) in strip-fastest order (neighbouring blocks read neighbouring bytes of the
// same rows), a grid-stride loop over them; partials[tile * cols + c] = tile's rows of column c summed.
template <class T, int kVec, bool kVectorized, bool kWrite>
__global__ void __launch_bounds__(kThreads) tile_sums_kernel(const T* grad, const T* saved, T* grad_input,
                                                             acc_t<T>* partials, int64_t rows, int64_t cols,
                                                             int64_t strips, int64_t items, Activation activation) {
  using A = acc_t<T>;
  constexpr int kStrip = kColumnThreads * kVec;
  __shared__ A row_group_sums[kRowThreads][kStrip];
  cuda::allow_dependent_launch();  // the fold's blocks may start as this grid's retire
  const int lane = static_cast<int>(threadIdx.x) % kColumnThreads;
  const int row_group = static_cast<int>(threadIdx.x) / kColumnThreads;
  const bool reads_saved = activation != Activation::kNone;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t tile = item / strips;
    const int64_t strip_first = (item % strips) * kStrip;
    const int64_t end_row = min(rows, (tile + 1) * kTileRows);
    A sums[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) sums[k] = A(0);
    for (int64_t step = tile * kTileRows + row_group; step < end_row; step += kRowThreads * kRowUnroll) {
      Pack<kVec, T> g[kRowUnroll], s[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {  // every load first: kRowUnroll rows in flight
        const int64_t r = step + u * kRowThreads;
        if (r < end_row) {
          g[u] = load_pack<kVec, kVectorized>(grad, r * cols, strip_first, lane, cols);
          if (reads_saved) s[u] = load_pack<kVec, kVectorized>(saved, r * cols, strip_first, lane, cols);
        }
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t r = step + u * kRowThreads;
        if (r < end_row) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            if (reads_saved) {
              g[u].value[k] = static_cast<T>(static_cast<A>(g[u].value[k]) *
                                             activation_derivative(static_cast<A>(s[u].value[k]), activation));
            }
            sums[k] += static_cast<A>(g[u].value[k]);  // the rounded value, as stored
          }
          if constexpr (kWrite) store_pack<kVec, kVectorized>(grad_input, r * cols, strip_first, lane, cols, g[u]);
        }
      }
    }
    // The row groups' sums added in row-group order, one column per thread.
#pragma unroll
    for (int k = 0; k < kVec; ++k) row_group_sums[row_group][strip_column<kVec, kVectorized>(lane, k)] = sums[k];
    __syncthreads();
    for (int c = threadIdx.x; c < kStrip; c += kThreads) {
      A total = row_group_sums[0][c];
#pragma unroll
      for (int group = 1; group < kRowThreads; ++group) total += row_group_sums[group][c];
      if (strip_first + c < cols) partials[tile * cols + strip_first + c] = total;
    }
    __syncthreads();  // row_group_sums is the next item's
  }
}

// grad_bias[c] = sum over tiles of partials[tile, c]: thread (x, y) adds tiles y, y + kFoldRows, ... in
// order, then the kFoldRows totals are added in y order.
template <class T>
__global__ void __launch_bounds__(kFoldColumns * kFoldRows)
    fold_kernel(const acc_t<T>* partials, int64_t tiles, int64_t cols, T* grad_bias) {
  using A = acc_t<T>;
  __shared__ A totals[kFoldRows][kFoldColumns];
  cuda::wait_for_prerequisite_grid();  // launched while tile_sums_kernel may still run: wait for its partials
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFoldColumns + threadIdx.x;
  A total = A(0);
  if (c < cols) {
#pragma unroll 4
    for (int64_t tile = threadIdx.y; tile < tiles; tile += kFoldRows) total += partials[tile * cols + c];
  }
  totals[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    A sum = totals[0][threadIdx.x];
#pragma unroll
    for (int y = 1; y < kFoldRows; ++y) sum += totals[y][threadIdx.x];
    grad_bias[c] = static_cast<T>(sum);
  }
}

template <class T, int kVec, bool kVectorized, bool kWrite>
void launch_tile_sums(const Cuda& device, const ActivationBiasGradArgs& args, acc_t<T>* partials, int64_t strips,
                      int64_t items) {
  const auto kernel = tile_sums_kernel<T, kVec, kVectorized, kWrite>;
  // As many blocks as are resident at once, at most one per item: results do not depend on it.
  const int per_sm = cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, 0, device.device);
  const int64_t resident = static_cast<int64_t>(per_sm) * cuda::device_limits(device.device).sms;
  const unsigned blocks = static_cast<unsigned>(std::min(items, resident));
  kernel<<<blocks, kThreads, 0, cuda::stream(device)>>>(
      static_cast<const T*>(args.grad), static_cast<const T*>(args.saved), static_cast<T*>(args.grad_input), partials,
      args.rows, args.cols, strips, items, args.activation);
}

}  // namespace

void activation_bias_grad(const Cuda& device, const ActivationBiasGradArgs& args, const Scratch& scratch) {
  if (args.cols == 0) return;
  const cudaStream_t stream = cuda::stream(device);
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    constexpr int kVec = vector_width<T>();
    if (args.rows == 0) {  // a sum over no rows; all-zero bits are 0.0 in every float type
      cuda::check(cudaMemsetAsync(args.grad_bias, 0, sizeof(T) * static_cast<size_t>(args.cols), stream),
                  "fused_dense: activation_bias_grad: cudaMemsetAsync");
      return;
    }
    const int64_t tiles = (args.rows + kTileRows - 1) / kTileRows;
    const int64_t strips = (args.cols + strip_width<T>() - 1) / strip_width<T>();
    A* partials = static_cast<A*>(scratch(sizeof(A) * static_cast<size_t>(tiles) * static_cast<size_t>(args.cols)));
    // 16-byte accesses where every row starts on a 16-byte boundary: aligned bases, whole packs a row.
    const bool vectorized = args.cols % kVec == 0 && is_aligned(args.grad) && is_aligned(args.saved) &&
                            is_aligned(args.grad_input);
    const bool write = args.grad_input != nullptr;
    if (vectorized && write) {
      launch_tile_sums<T, kVec, true, true>(device, args, partials, strips, tiles * strips);
    } else if (vectorized) {
      launch_tile_sums<T, kVec, true, false>(device, args, partials, strips, tiles * strips);
    } else if (write) {
      launch_tile_sums<T, kVec, false, true>(device, args, partials, strips, tiles * strips);
    } else {
      launch_tile_sums<T, kVec, false, false>(device, args, partials, strips, tiles * strips);
    }
    const int64_t fold_blocks = (args.cols + kFoldColumns - 1) / kFoldColumns;
    cuda::launch_dependent(device, fold_kernel<T>, dim3(static_cast<unsigned>(fold_blocks)),
                           dim3(kFoldColumns, kFoldRows), 0, stream, static_cast<const A*>(partials), tiles, args.cols,
                           static_cast<T*>(args.grad_bias));
  });
  cuda::check_launch("fused_dense: activation_bias_grad");
}

}  // namespace apex::fused_dense
