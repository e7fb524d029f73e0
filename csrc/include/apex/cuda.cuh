#pragma once
// What a .cu kernel source includes: the device and dtype tags, 16-byte vector accesses, and a few
// launch helpers; no torch headers (a .cu that includes ATen/ATen.h spends ~35 s compiling them
// before its first kernel; this header ~3 s).

#include <cuda_runtime.h>

#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "apex/aligned_vector.cuh"
#include "apex/device.h"
#include "apex/dtype.h"

namespace apex::cuda {

inline cudaStream_t stream(const Cuda& device) { return static_cast<cudaStream_t>(device.stream); }

// Raises (torch turns it into a RuntimeError naming the op) if the last launch failed.
inline void check_launch(const char* op) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw std::runtime_error(std::string(op) + ": CUDA error: " + cudaGetErrorString(error));
}

// Multiprocessors of `device`, asked once per device.
inline int sm_count(int device) {
  constexpr int kMaxDevices = 64;
  static int counts[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) device = 0;
  if (counts[device] == 0) {
    int count = 0;
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    counts[device] = std::max(count, 1);
  }
  return counts[device];
}

// Blocks for `work` items of `per_block` each, capped at `blocks_per_sm` resident blocks per SM
// (a grid-stride loop does the rest: enough warps to hide memory latency, no tail of tiny waves).
inline unsigned grid_size(int64_t work, int64_t per_block, int blocks_per_sm, const Cuda& device) {
  const int64_t wanted = (work + per_block - 1) / per_block;
  const int64_t cap = static_cast<int64_t>(sm_count(device.device)) * blocks_per_sm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(wanted, cap)));
}

}  // namespace apex::cuda
