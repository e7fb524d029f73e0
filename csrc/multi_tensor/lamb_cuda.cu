// CUDA kernels of LAMB: a whole step, and apex's two-stage API. A step's kernels take a unit per
// params dtype (dtype_units.h); this one dispatches to them and holds the float32 params' kernels.
#include "apex/multi_tensor_rows.cuh"
#include "lamb.h"

namespace apex::multi_tensor {

extern template void run_lamb<CudaRowEngine, OnlyDtype<c10::Half>>(const Cuda&, const TensorLists&, int*,
                                                                    const LambArgs&,
                                                                    const LambBuffers&);  // lamb_cuda_float16.cu
extern template void run_lamb<CudaRowEngine, OnlyDtype<c10::BFloat16>>(const Cuda&, const TensorLists&, int*,
                                                                        const LambArgs&,
                                                                        const LambBuffers&);  // lamb_cuda_bfloat16.cu

void lamb(const Cuda& d, const TensorLists& l, int* flag, const LambArgs& args, const LambBuffers& buffers) {
  dispatch_floating<false>(l.dtypes[1], [&](auto p) {
    run_lamb<CudaRowEngine, OnlyDtype<TypeOf<decltype(p)>>>(d, l, flag, args, buffers);
  });
}
void lamb_direction(const Cuda& d, const TensorLists& l, int* flag, const LambDirectionFunctor& op) {
  run_lamb_direction<CudaEngine>(d, l, flag, op);
}
void lamb_stage2(const Cuda& d, const TensorLists& l, int* flag, const LambStage2Functor& op) {
  run_lamb_stage2<CudaEngine>(d, l, flag, op);
}

}  // namespace apex::multi_tensor
