// group_norm: the backward kernels for half and bfloat16 data, a unit of their own
// (group_norm_kernels.cuh).
#include "group_norm_kernels.cuh"

namespace apex::group_norm {
template void backward_as<c10::Half>(const Cuda&, const BackwardArgs&);
template void backward_as<c10::BFloat16>(const Cuda&, const BackwardArgs&);
}  // namespace apex::group_norm
