// Pieces the syncbn CUDA kernels share: the 16-byte vector accesses (apex's
// aligned_vector.cuh), the block-level merge of partial statistics, and launch geometry.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>

#include "apex/aligned_vector.cuh"
#include "syncbn_ops.h"

namespace apex_syncbn {

using apex::AlignedVector;
using apex::load_vector;
using apex::store_vector;
using apex::vector_width;

// An absent optional tensor never blocks the vectorized path.
inline bool aligned_or_absent(const Tensor& t) { return !t.defined() || apex::is_aligned(t.const_data_ptr()); }

// Threads of a block laid out as [rows][columns] (row-major over threadIdx) merge
// their states per column; the result is valid in row 0. `rows` must be a power of
// two. The fixed merge order keeps results bitwise reproducible.
template <typename State>
__device__ State merge_columns(State state, State* shared, int row, int column, int rows, int columns) {
  shared[row * columns + column] = state;
  __syncthreads();
  for (int half = rows / 2; half > 0; half /= 2) {
    if (row < half) {
      state.merge(shared[(row + half) * columns + column]);
      shared[row * columns + column] = state;
    }
    __syncthreads();
  }
  return state;
}

// Enough resident blocks to keep every SM streaming memory (grids whose blocks each
// cover a fixed share of the work).
inline int64_t target_blocks() {
  constexpr int kBlocksPerSM = 4;
  return int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * kBlocksPerSM;
}

// As many blocks of `kernel` as fit on the GPU at once. Grid-stride kernels launched
// with this run as one wave, so per-thread setup (loading per-channel constants) is
// paid once per thread and amortised over many rows, with no partial last wave.
template <typename Kernel>
int64_t one_wave_blocks(Kernel kernel, int threads) {
  int blocks_per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, 0));
  return int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * std::max(blocks_per_sm, 1);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int next_power_of_two(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// Channels-last kernels give each thread VEC consecutive channels of a row (one
// 16-byte vector) and walk rows, keeping per-channel state in registers. That state
// limits residency to 2-5 blocks of 256 threads per SM: with one 16-byte load per
// thread in flight, 8-20 KB per SM, short of the ~23 KB that HBM3 needs to stream
// (about 16 B per cycle per SM times ~1400 cycles of latency). Each thread therefore
// loads kRowsInFlight rows before it uses any of them.
constexpr int kRowsInFlight = 2;

}  // namespace apex_syncbn
