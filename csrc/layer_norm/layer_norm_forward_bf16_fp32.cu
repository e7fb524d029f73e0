// LayerNorm / RMSNorm forward kernels for bfloat16 data, float32 parameters (one dtype pair per file: they compile in
// parallel).
#include "layer_norm_forward.cuh"

namespace apex::layer_norm {
template void forward_typed<c10::BFloat16, float>(const Cuda&, const ForwardArgs&);
}  // namespace apex::layer_norm
