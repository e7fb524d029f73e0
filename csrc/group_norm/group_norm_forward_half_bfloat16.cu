// group_norm: the forward kernels for half and bfloat16 data, a unit of their own
// (group_norm_kernels.cuh).
#include "group_norm_kernels.cuh"

namespace apex::group_norm {
template void forward_as<c10::Half>(const Cuda&, const ForwardArgs&);
template void forward_as<c10::BFloat16>(const Cuda&, const ForwardArgs&);
}  // namespace apex::group_norm
