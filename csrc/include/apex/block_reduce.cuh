#pragma once
// Lane-group, warp and block reductions of any small value (a float, or a struct of partial statistics such
// as an online-softmax max/sum pair) under any associative combine function. Device code only;
// include after apex/cuda.cuh.
//
//   struct Stats { float max, sum; };
//   auto merge = [] __device__(Stats a, Stats b) { ... };
//   __shared__ Stats scratch[kMaxThreads / C10_WARP_SIZE];
//   Stats total = apex::cuda::block_reduce(mine, merge, Stats{...identity...}, scratch);  // thread 0 holds it
//   (block_all_reduce: every thread gets it; group_reduce / warp_reduce: within a warp, no shared memory)
//
// Values cross lanes as 32-bit words, so a struct reduces in one shuffle per word and ops need no
// shuffle of their own. On ROCm (64-lane wavefronts) C10_WARP_SIZE is 64 and the same code holds.

#include <c10/macros/Macros.h>

#include <cstring>
#include <type_traits>

namespace apex::cuda {

// `value` of the lane whose index is this lane's XOR lane_mask (every lane of the warp takes part).
template <class T>
C10_DEVICE C10_ALWAYS_INLINE T shuffle_xor(const T& value, int lane_mask) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) % sizeof(int) == 0,
                "shuffle_xor moves values as 32-bit words");
  constexpr int kWords = sizeof(T) / sizeof(int);
  int words[kWords];
  std::memcpy(words, &value, sizeof(T));
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
#if defined(USE_ROCM)
    words[k] = __shfl_xor(words[k], lane_mask);
#else
    words[k] = __shfl_xor_sync(0xffffffffu, words[k], lane_mask);
#endif
  }
  T out;
  std::memcpy(&out, words, sizeof(T));
  return out;
}

// combine() of `value` over each group of `lanes` neighbouring lanes (a power of two dividing the
// warp size: several short rows per warp); every lane of the warp calls it and gets its group's result.
template <class T, class Combine>
C10_DEVICE C10_ALWAYS_INLINE T group_reduce(T value, int lanes, Combine combine) {
#pragma unroll
  for (int offset = lanes / 2; offset > 0; offset /= 2) value = combine(value, shuffle_xor(value, offset));
  return value;
}

// combine() of `value` over the warp; every lane gets the result.
template <class T, class Combine>
C10_DEVICE C10_ALWAYS_INLINE T warp_reduce(T value, Combine combine) {
  return cuda::group_reduce(value, C10_WARP_SIZE, combine);
}

// combine() of `value` over the block (any shape; its thread count a multiple of the warp size);
// the result is valid in warp 0 (every lane of it; thread 0 is its lane 0). `scratch` holds one T per
// warp of the block. Every thread of the block must call it; it synchronizes before returning, so
// the scratch can be reused right away (a loop over rows calls it once per row).
template <class T, class Combine>
C10_DEVICE T block_reduce(T value, Combine combine, const T& identity, T* scratch) {
  value = warp_reduce(value, combine);
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  const int warps = threads / C10_WARP_SIZE;
  if (warps == 1) return value;
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int lane = tid % C10_WARP_SIZE, warp = tid / C10_WARP_SIZE;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) value = warp_reduce(lane < warps ? scratch[lane] : identity, combine);
  __syncthreads();
  return value;
}

// block_reduce() whose result every thread of the block gets, through `*result` (one T of shared
// memory besides `scratch`). The slot is rewritten only after the next call's first barrier (or,
// in a one-warp block, its warp-wide shuffles), which every reader of this result has passed.
template <class T, class Combine>
C10_DEVICE T block_all_reduce(T value, Combine combine, const T& identity, T* scratch, T* result) {
  value = cuda::block_reduce(value, combine, identity, scratch);
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) *result = value;
  __syncthreads();
  return *result;
}

}  // namespace apex::cuda
