// CUDA kernel of NovoGrad's update (its norms are the norm family's).
#include "apex/multi_tensor_apply.cuh"
#include "novograd.h"

namespace apex::multi_tensor {

void novograd_update(const Cuda& d, const TensorLists& l, int* flag, const NovogradFunctor& op) {
  run_novograd_update<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
