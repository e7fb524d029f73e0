// LayerNorm / RMSNorm forward kernels for bfloat16 data and parameters (one dtype pair per file: they compile in
// parallel).
#include "layer_norm_forward.cuh"

namespace apex::layer_norm {
template void forward_typed<c10::BFloat16, c10::BFloat16>(const Cuda&, const ForwardArgs&);
}  // namespace apex::layer_norm
