// LayerNorm backward_fused launches for float32 rows at 1 and 2 vectors a thread (up to 4096 columns): a
// unit of their own (layer_norm_backward.cuh, launch_fused).
#include "layer_norm_backward.cuh"

namespace apex::layer_norm {
template bool launch_fused<float, float, false, 1>(FloatLaunch&);
template bool launch_fused<float, float, false, 2>(FloatLaunch&);
}  // namespace apex::layer_norm
