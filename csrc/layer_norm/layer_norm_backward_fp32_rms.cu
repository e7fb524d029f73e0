// RMSNorm backward kernels for float32 and float64 data and parameters (one dtype pair and norm per
// file: they compile in parallel).
#include "layer_norm_backward.cuh"

namespace apex::layer_norm {
template void backward_typed<float, float, true>(const Cuda&, const BackwardArgs&, const Scratch&);
template void backward_typed<double, double, true>(const Cuda&, const BackwardArgs&, const Scratch&);
}  // namespace apex::layer_norm
