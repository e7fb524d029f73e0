// CUDA kernels of amp's copies and unscales (multi_tensor_scale) and of the loss-scale update with
// hysteresis. multi_tensor_axpby's, one kernel per dtype triple, compile in a unit of their own
// beside this one (axpby_cuda.cu): together they were amp_C's slowest unit after SGD's and LAMB's.
#include "apex/multi_tensor_apply.cuh"
#include "scale.h"
#include "update_scale_hysteresis.h"

namespace apex::multi_tensor {

void scale(const Cuda& d, const TensorLists& l, int* flag, const ScaleFunctor& op) {
  run_scale<CudaEngine>(d, l, flag, op);
}
void update_scale_hysteresis(const Cuda& d, const ScaleHysteresisUpdate& update) { CudaEngine::run_once(d, update); }

}  // namespace apex::multi_tensor
