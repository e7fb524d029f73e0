// LayerNorm backward_fused launches for float32 rows at 4 and 8 vectors a thread (4100-16384 columns): a unit
// of their own (layer_norm_backward.cuh, launch_fused).
#include "layer_norm_backward.cuh"

namespace apex::layer_norm {
template bool launch_fused<float, float, false, 4>(FloatLaunch&);
template bool launch_fused<float, float, false, 8>(FloatLaunch&);
}  // namespace apex::layer_norm
