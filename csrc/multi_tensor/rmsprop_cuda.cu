// CUDA kernels of RMSprop (torch's and TensorFlow's).
#include "apex/multi_tensor_apply.cuh"
#include "rmsprop.h"

namespace apex::multi_tensor {

void rmsprop(const Cuda& d, const TensorLists& l, int* flag, const RmspropFunctor& op) {
  run_rmsprop<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
