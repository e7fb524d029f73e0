// CUDA kernels of SGD.
#include "apex/multi_tensor_apply.cuh"
#include "sgd.h"

namespace apex::multi_tensor {

void sgd(const Cuda& d, const TensorLists& l, int* flag, const SgdFunctor& op) {
  run_momentum_step<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
