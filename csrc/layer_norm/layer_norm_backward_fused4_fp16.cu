// LayerNorm backward_fused launches for float16 rows at 4 vectors a thread (8200-16384 columns): a unit of their own
// (layer_norm_backward.cuh, launch_fused).
#include "layer_norm_backward.cuh"

namespace apex::layer_norm {
template bool launch_fused<c10::Half, c10::Half, false, 4>(Fp16Launch&);
}  // namespace apex::layer_norm
