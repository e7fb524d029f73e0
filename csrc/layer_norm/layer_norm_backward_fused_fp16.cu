// LayerNorm backward_fused launches for float16 rows at 1 and 2 vectors a thread (up to 8192 columns): a unit of their
// own (layer_norm_backward.cuh, launch_fused).
#include "layer_norm_backward.cuh"

namespace apex::layer_norm {
template bool launch_fused<c10::Half, c10::Half, false, 1>(Fp16Launch&);
template bool launch_fused<c10::Half, c10::Half, false, 2>(Fp16Launch&);
}  // namespace apex::layer_norm
