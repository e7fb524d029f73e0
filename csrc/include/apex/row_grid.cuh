#pragma once
// A 2-D launch over [rows, packs] work (a pack: the 16-byte vector, or single element, a thread
// handles at once): threadIdx.x / blockIdx.x walk the packs of a row, threadIdx.y / blockIdx.y the
// rows, both in grid-stride loops, so any shape is covered without an index division per pack.
// Row-wise ops whose rows are addressed independently (gathered rows, per-row labels) use it:
//
//   const RowGrid launch = row_grid(rows, packs, device);
//   kernel<<<launch.grid, launch.block, 0, cuda::stream(device)>>>(...);
//   ... in the kernel: for_each_row(rows, [&](int64_t row) {
//                        /* per-row values */ for_each_pack(packs, [&](int64_t pack) { ... }); });
//
// Include after apex/cuda.cuh.

#include <algorithm>
#include <cstdint>

namespace apex::cuda {

struct RowGrid {
  dim3 grid;
  dim3 block;
};

// kThreads threads per block, as many along a row as its packs need (a power of two), the rest
// over rows; at most blocks_per_sm resident blocks per SM in all (the loops do the rest).
inline RowGrid row_grid(int64_t rows, int64_t packs, const Cuda& device, int threads = 256, int blocks_per_sm = 8) {
  unsigned x = 1;
  while (x < static_cast<unsigned>(threads) && static_cast<int64_t>(x) < packs) x *= 2;
  const unsigned y = static_cast<unsigned>(threads) / x;
  const int64_t blocks_x = std::max<int64_t>(1, (packs + x - 1) / x);
  const int64_t cap = static_cast<int64_t>(sm_count(device.device)) * blocks_per_sm;
  const int64_t blocks_y = std::max<int64_t>(1, std::min<int64_t>((rows + y - 1) / y, std::max<int64_t>(1, cap / blocks_x)));
  constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y
  return {dim3(static_cast<unsigned>(std::min<int64_t>(blocks_x, 1 << 30)),
               static_cast<unsigned>(std::min(blocks_y, kMaxGridY))),
          dim3(x, y)};
}

// Calls f(row) for every row this thread works on; inside it, for_each_pack walks the row's packs.
template <class F>
C10_DEVICE C10_ALWAYS_INLINE void for_each_row(int64_t rows, F&& f) {
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t row = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; row < rows; row += step) f(row);
}

// Calls f(pack) for every pack < packs of the current row that this thread owns.
template <class F>
C10_DEVICE C10_ALWAYS_INLINE void for_each_pack(int64_t packs, F&& f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t pack = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pack < packs; pack += step) f(pack);
}

}  // namespace apex::cuda
