// CUDA kernels of SGD for bfloat16 grads (a unit per grads dtype: dtype_units.h; sgd_cuda.cu dispatches).
#include "apex/multi_tensor_apply.cuh"
#include "sgd.h"

namespace apex::multi_tensor {
template void run_momentum_step<CudaEngine, OnlyDtype<c10::BFloat16>>(const Cuda&, const TensorLists&, int*,
                                                                      const SgdFunctor&);
}  // namespace apex::multi_tensor
