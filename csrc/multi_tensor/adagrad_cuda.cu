// CUDA kernels of Adagrad.
#include "adagrad.h"
#include "apex/multi_tensor_apply.cuh"

namespace apex::multi_tensor {

void adagrad(const Cuda& d, const TensorLists& l, int* flag, const AdagradFunctor& op) {
  run_adagrad<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
