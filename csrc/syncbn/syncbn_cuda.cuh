#pragma once
// Pieces the syncbn CUDA kernels share: the block-level merge of partial statistics, and launch
// geometry. No torch headers (apex/cuda.cuh only).
#include <algorithm>
#include <cstdint>

#include "apex/cuda.cuh"
#include "apex/occupancy.cuh"
#include "apex/acc_type.h"
#include "syncbn.h"

namespace apex::syncbn {

// An absent operand never blocks the vectorized path.
inline bool aligned_or_absent(const void* p) { return p == nullptr || is_aligned(p); }

// Threads of a block laid out as [rows][columns] (row-major over threadIdx) merge their states per
// column; the result is valid in row 0. `rows` must be a power of two. The fixed merge order keeps
// results bitwise reproducible.
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

// Enough resident blocks to keep every SM streaming memory (grids whose blocks each cover a fixed
// share of the work).
inline int64_t target_blocks(const Cuda& device) {
  constexpr int kBlocksPerSM = 4;
  return int64_t(cuda::sm_count(device.device)) * kBlocksPerSM;
}

// As many blocks of `kernel` as fit on the GPU at once. Grid-stride kernels launched with this run as
// one wave, so per-thread setup (loading per-channel constants) is paid once per thread and amortised
// over many rows, with no partial last wave.
template <typename Kernel>
int64_t one_wave_blocks(Kernel kernel, int threads, const Cuda& device) {
  const int per_sm = cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, 0, device.device);
  return int64_t(cuda::sm_count(device.device)) * per_sm;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int next_power_of_two(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// Channels-last kernels give each thread VEC consecutive channels of a row (one 16-byte vector) and
// walk rows, keeping per-channel state in registers. That state limits residency to 2-5 blocks of 256
// threads per SM: with one 16-byte load per thread in flight, 8-20 KB per SM, short of the ~23 KB
// that HBM3 needs to stream (about 16 B per cycle per SM times ~1400 cycles of latency). Each thread
// therefore loads kRowsInFlight rows before it uses any of them.
constexpr int kRowsInFlight = 2;

}  // namespace apex::syncbn
