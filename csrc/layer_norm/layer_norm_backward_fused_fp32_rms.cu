// RMSNorm backward_fused launches for float32 rows at 1, 2, 4 and 8 vectors a thread (up to 16384 columns): a
// unit of their own (layer_norm_backward.cuh, launch_fused).
#include "layer_norm_backward.cuh"

namespace apex::layer_norm {
template bool launch_fused<float, float, true, 1>(FloatLaunch&);
template bool launch_fused<float, float, true, 2>(FloatLaunch&);
template bool launch_fused<float, float, true, 4>(FloatLaunch&);
template bool launch_fused<float, float, true, 8>(FloatLaunch&);
}  // namespace apex::layer_norm
