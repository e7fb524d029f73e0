// Pieces the syncbn CUDA kernels share: 16-byte vector loads, the block-level
// merge of partial statistics, and launch geometry.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "syncbn_ops.h"

namespace apex_syncbn {

// Widest load one instruction can do is 16 bytes.
constexpr int kVectorBytes = 16;

template <typename scalar_t>
constexpr int vector_width() {
  return kVectorBytes / sizeof(scalar_t);
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T value[N];
};

template <int N, typename T>
__device__ __forceinline__ Pack<T, N> load_pack(const T* base, int64_t offset) {
  return *reinterpret_cast<const Pack<T, N>*>(base + offset);
}

template <int N, typename T>
__device__ __forceinline__ void store_pack(T* base, int64_t offset, const Pack<T, N>& pack) {
  *reinterpret_cast<Pack<T, N>*>(base + offset) = pack;
}

inline bool is_vector_aligned(const Tensor& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.const_data_ptr()) % kVectorBytes == 0;
}

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

// Enough resident blocks to keep every SM streaming memory.
inline int64_t target_blocks() {
  constexpr int kBlocksPerSM = 4;
  return int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * kBlocksPerSM;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace apex_syncbn
