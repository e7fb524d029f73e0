// CUDA kernels of the norm family (every reduction of amp_C goes through norm()).
#include "apex/multi_tensor_apply.cuh"
#include "l2norm.h"

namespace apex::multi_tensor {

void norm(const Cuda& d, const TensorLists& l, int* flag, const NormArgs& args) {
  run_norm<CudaEngine>(d, l, flag, args);
}

int64_t reduction_scratch(const Cuda& device, int64_t count) {
  return cuda::reduction_scratch_for<cuda::DefaultLaunchConfig>(device, count);
}

}  // namespace apex::multi_tensor
