// CUDA kernels of a LAMB step for bfloat16 params (a unit per params dtype: dtype_units.h; lamb_cuda.cu
// dispatches).
#include "apex/multi_tensor_rows.cuh"
#include "lamb.h"

namespace apex::multi_tensor {
template void run_lamb<CudaRowEngine, OnlyDtype<c10::BFloat16>>(const Cuda&, const TensorLists&, int*,
                                                                const LambArgs&, const LambBuffers&);
}  // namespace apex::multi_tensor
