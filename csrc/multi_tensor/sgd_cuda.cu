// CUDA kernels of SGD: a unit per grads dtype (dtype_units.h); this one dispatches to them and holds
// the float32 grads' kernels.
#include "apex/multi_tensor_apply.cuh"
#include "sgd.h"

namespace apex::multi_tensor {

extern template void run_momentum_step<CudaEngine, OnlyDtype<c10::Half>>(const Cuda&, const TensorLists&, int*,
                                                                          const SgdFunctor&);  // sgd_cuda_float16.cu
extern template void run_momentum_step<CudaEngine, OnlyDtype<c10::BFloat16>>(
    const Cuda&, const TensorLists&, int*, const SgdFunctor&);  // sgd_cuda_bfloat16.cu

void sgd(const Cuda& d, const TensorLists& l, int* flag, const SgdFunctor& op) {
  dispatch_floating<false>(l.dtypes[0], [&](auto g) {
    run_momentum_step<CudaEngine, OnlyDtype<TypeOf<decltype(g)>>>(d, l, flag, op);
  });
}

}  // namespace apex::multi_tensor
