// LayerNorm backward_fused launches for bfloat16 rows with float32 parameters at 1, 2 and 4 vectors a thread (up
// to 16384 columns): a unit of their own (layer_norm_backward.cuh, launch_fused).
#include "layer_norm_backward.cuh"

namespace apex::layer_norm {
template bool launch_fused<c10::BFloat16, float, false, 1>(Bf16FloatLaunch&);
template bool launch_fused<c10::BFloat16, float, false, 2>(Bf16FloatLaunch&);
template bool launch_fused<c10::BFloat16, float, false, 4>(Bf16FloatLaunch&);
}  // namespace apex::layer_norm
