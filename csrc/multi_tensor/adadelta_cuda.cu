// CUDA kernels of Adadelta.
#include "adadelta.h"
#include "apex/multi_tensor_apply.cuh"

namespace apex::multi_tensor {

void adadelta(const Cuda& d, const TensorLists& l, int* flag, const AdadeltaFunctor& op) {
  run_adadelta<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
