// group_norm: the backward kernels for float and double data, a unit of their own
// (group_norm_kernels.cuh).
#include "group_norm_kernels.cuh"

namespace apex::group_norm {
template void backward_as<float>(const Cuda&, const BackwardArgs&);
template void backward_as<double>(const Cuda&, const BackwardArgs&);
}  // namespace apex::group_norm
