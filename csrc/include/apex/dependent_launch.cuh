#pragma once
// Programmatic dependent launch (Hopper and later): the second of two back-to-back kernels starts
// while the first is finishing, and waits for the first only where it reads what the first wrote.
// For two short passes over the same data it hides the second pass's start-up (block launch, its
// first loads) behind the first pass's tail.
//
//   first kernel:   cuda::allow_dependent_launch();      // early: the next grid may start as SMs free up
//   second kernel:  ...loads of data the first kernel does not write...
//                   cuda::wait_for_prerequisite_grid();  // the first grid has finished, its writes visible
//   host:           cuda::launch_dependent(device, second_kernel, grid, threads, shared, stream, args...);
//
// Only the second kernel is launched this way: the first still starts after everything before it
// in the stream, so whatever the second reads before its wait was complete before either began.
// Where unsupported (before sm_90, ROCm) the launch is an ordinary stream-ordered one and the two
// device calls do nothing: the stream order already guarantees what the wait would.
#include <cuda_runtime.h>

#include <c10/macros/Macros.h>

#include <utility>

#include "apex/cuda.cuh"
#include "apex/occupancy.cuh"

namespace apex::cuda {

C10_DEVICE C10_ALWAYS_INLINE void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

C10_DEVICE C10_ALWAYS_INLINE void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Both, first thing in a kernel of a chain of dependent launches over each other's outputs: it
// touches no memory before the previous grid has finished, and lets the next grid start at once.
C10_DEVICE C10_ALWAYS_INLINE void start_dependent_kernel() {
  wait_for_prerequisite_grid();
  allow_dependent_launch();
}

// Whether `device` runs dependent launches (compute capability 9.0 or later).
inline bool supports_dependent_launch(int device) {
#if defined(USE_ROCM)
  (void)device;
  return false;
#else
  return device_limits(device).compute_major >= 9;
#endif
}

// kernel<<<grid, threads, shared, stream>>>(args...), allowed to start before the stream's previous
// kernel has finished (see the file comment); check_launch() reports a failure as for <<<>>>.
template <class... Params, class... Args>
void launch_dependent(const Cuda& device, void (*kernel)(Params...), dim3 grid, dim3 threads, size_t shared,
                      cudaStream_t stream, Args&&... args) {
#if !defined(USE_ROCM)
  if (supports_dependent_launch(device.device)) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = threads;
    config.dynamicSmemBytes = shared;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    // An error is left for cudaGetLastError (check_launch), as a <<<>>> launch leaves it.
    (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
    return;
  }
#endif
  kernel<<<grid, threads, shared, stream>>>(std::forward<Args>(args)...);
}

}  // namespace apex::cuda
