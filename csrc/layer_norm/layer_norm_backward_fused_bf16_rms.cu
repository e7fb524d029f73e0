// RMSNorm backward_fused launches for bfloat16 rows at 1, 2 and 4 vectors a thread (up to 16384 columns): a unit of
// their own (layer_norm_backward.cuh, launch_fused).
#include "layer_norm_backward.cuh"

namespace apex::layer_norm {
template bool launch_fused<c10::BFloat16, c10::BFloat16, true, 1>(Bf16Launch&);
template bool launch_fused<c10::BFloat16, c10::BFloat16, true, 2>(Bf16Launch&);
template bool launch_fused<c10::BFloat16, c10::BFloat16, true, 4>(Bf16Launch&);
}  // namespace apex::layer_norm
