// fused_softmax: the forward kernels for bfloat16 (softmax_forward.cuh; one unit per dtype, compiled in parallel).
#include "softmax_forward.cuh"

namespace apex::fused_softmax {
template void forward_as<c10::BFloat16>(const Cuda& device, const ForwardArgs& args);
}  // namespace apex::fused_softmax
