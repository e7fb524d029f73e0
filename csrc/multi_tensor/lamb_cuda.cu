// CUDA kernels of LAMB: a whole step, and apex's two-stage API.
#include "apex/multi_tensor_rows.cuh"
#include "lamb.h"

namespace apex::multi_tensor {

void lamb(const Cuda& d, const TensorLists& l, int* flag, const LambArgs& args, const LambBuffers& buffers) {
  run_lamb<CudaRowEngine>(d, l, flag, args, buffers);
}
void lamb_direction(const Cuda& d, const TensorLists& l, int* flag, const LambDirectionFunctor& op) {
  run_lamb_direction<CudaEngine>(d, l, flag, op);
}
void lamb_stage2(const Cuda& d, const TensorLists& l, int* flag, const LambStage2Functor& op) {
  run_lamb_stage2<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
