// CUDA kernels of LARS (SGD's lists and dtype combinations).
#include "apex/multi_tensor_apply.cuh"
#include "lars.h"

namespace apex::multi_tensor {

void lars(const Cuda& d, const TensorLists& l, int* flag, const LarsFunctor& op) {
  run_momentum_step<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
