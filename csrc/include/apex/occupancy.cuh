#pragma once
// Launch planning that asks the CUDA runtime: the limits of a device, and how many blocks of a kernel
// an SM holds. Each answer is asked once and cached (per device; per kernel, block size and shared
// memory): the runtime queries cost microseconds, which a per-call launch decision cannot afford.
//
//   const cuda::DeviceLimits& limits = cuda::device_limits(device.device);
//   const int per_sm = cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads,
//                                                  dynamic_shared_bytes, device.device);
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "apex/cuda.cuh"

namespace apex::cuda {

// Block shapes are planned for this warp size (any warp size computes the same results).
#if defined(USE_ROCM)
constexpr int kPlanWarp = 64;
#else
constexpr int kPlanWarp = 32;
#endif

// Threads rounded up to whole warps: what a block of `threads` occupies.
inline int whole_warps(int threads) { return (threads + kPlanWarp - 1) / kPlanWarp * kPlanWarp; }

// A block of `cols` x `rows` threads (thread (r, k) = threadIdx.x = r * cols + k) for rows of
// `packs` packs: one thread per pack up to max_threads, then as many rows as leave the fewest idle
// lanes in its warps (ties: more rows).
struct BlockTile {
  int cols, rows;
};

inline BlockTile block_tile(int64_t packs, int max_threads) {
  const int cols = static_cast<int>(std::min<int64_t>(std::max<int64_t>(packs, 1), max_threads));
  BlockTile tile{cols, 1};
  double best = 0;
  for (int rows = 1; cols * rows <= max_threads; ++rows) {
    const double used = static_cast<double>(cols * rows) / whole_warps(cols * rows);
    if (used >= best) best = used, tile.rows = rows;
  }
  return tile;
}

inline void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string("apex: ") + what + ": " + cudaGetErrorString(error));
}

// What launch planning needs to know about a device.
struct DeviceLimits {
  int sms = 1;
  int warp_size = 32;
  int compute_major = 0;                 // compute capability's major version (9: Hopper)
  size_t shared_per_block_optin = 0;     // shared memory one block may use once a kernel opts in
  size_t shared_per_sm = 0;
  size_t reserved_shared_per_block = 0;  // what the system keeps of an SM's shared memory per resident block
};

inline const DeviceLimits& device_limits(int device) {
  constexpr int kMaxDevices = 64;
  static std::once_flag asked[kMaxDevices];
  static DeviceLimits limits[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) throw std::out_of_range("apex: device index out of range");
  std::call_once(asked[device], [device] {
    const auto attribute = [device](cudaDeviceAttr what) {
      int value = 0;
      check(cudaDeviceGetAttribute(&value, what, device), "cudaDeviceGetAttribute");
      return value;
    };
    DeviceLimits& l = limits[device];
    l.sms = std::max(attribute(cudaDevAttrMultiProcessorCount), 1);
    l.warp_size = attribute(cudaDevAttrWarpSize);
    l.compute_major = attribute(cudaDevAttrComputeCapabilityMajor);
    l.shared_per_block_optin = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    l.shared_per_sm = attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
    l.reserved_shared_per_block = attribute(cudaDevAttrReservedSharedMemoryPerBlock);
  });
  return limits[device];
}

// How many blocks of `kernel` (threads per block, dynamic shared memory) an SM of `device` holds at
// once, at least 1. A kernel asked about with more dynamic shared memory than it may use now is
// opted in to all the device allows, so that it can then be launched with that much. What it may
// use without opting in is 48 KiB less its own static shared memory: testing the dynamic size alone
// against 48 KiB let 48 KiB-and-a-little launches through unopted, and they failed.
// `device` must be the current device.
inline int resident_blocks_per_sm(const void* kernel, int threads, size_t dynamic_shared, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t, int>, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto [entry, fresh] = cache.try_emplace({kernel, threads, dynamic_shared, device}, 0);
  if (fresh) {
    try {
      if (dynamic_shared > 0) {
        cudaFuncAttributes attributes;
        check(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes");
        if (dynamic_shared > static_cast<size_t>(attributes.maxDynamicSharedSizeBytes)) {
          const size_t allowed = device_limits(device).shared_per_block_optin - attributes.sharedSizeBytes;
          check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(allowed)),
                "cudaFuncSetAttribute");
        }
      }
      int blocks = 0;
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic_shared),
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      entry->second = std::max(blocks, 1);
    } catch (...) {
      cache.erase(entry);  // ask again next time rather than remember a failure
      throw;
    }
  }
  return entry->second;
}

}  // namespace apex::cuda
