// LayerNorm backward kernels for float16 data and parameters (one dtype pair and norm per file:
// they compile in parallel).
#include "layer_norm_backward.cuh"

namespace apex::layer_norm {
template void backward_typed<c10::Half, c10::Half, false>(const Cuda&, const BackwardArgs&, const Scratch&);
}  // namespace apex::layer_norm
