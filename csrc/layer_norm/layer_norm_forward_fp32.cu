// LayerNorm / RMSNorm forward kernels for float32 and float64 data and parameters (one dtype pair
// or two per file: they compile in parallel).
#include "layer_norm_forward.cuh"

namespace apex::layer_norm {
template void forward_typed<float, float>(const Cuda&, const ForwardArgs&);
template void forward_typed<double, double>(const Cuda&, const ForwardArgs&);
}  // namespace apex::layer_norm
