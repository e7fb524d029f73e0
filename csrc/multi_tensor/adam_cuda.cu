// CUDA kernels of Adam/AdamW (every entry point) and BertAdam.
#include "adam.h"
#include "apex/multi_tensor_apply.cuh"

namespace apex::multi_tensor {

void adam(const Cuda& d, const TensorLists& l, int* flag, const AdamFunctor& op) {
  run_adam<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
