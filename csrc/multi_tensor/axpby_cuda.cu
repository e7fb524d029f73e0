// CUDA kernels of multi_tensor_axpby (out = a * x + b * y, any dtype of each list: 27 kernels), apart
// from scale_cuda.cu's so that ninja compiles the two in parallel.
#include "apex/multi_tensor_apply.cuh"
#include "scale.h"

namespace apex::multi_tensor {

void axpby(const Cuda& d, const TensorLists& l, int* flag, const AxpbyFunctor& op) {
  run_axpby<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
