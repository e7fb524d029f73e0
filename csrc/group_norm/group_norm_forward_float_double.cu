// group_norm: the forward kernels for float and double data, a unit of their own
// (group_norm_kernels.cuh).
#include "group_norm_kernels.cuh"

namespace apex::group_norm {
template void forward_as<float>(const Cuda&, const ForwardArgs&);
template void forward_as<double>(const Cuda&, const ForwardArgs&);
}  // namespace apex::group_norm
