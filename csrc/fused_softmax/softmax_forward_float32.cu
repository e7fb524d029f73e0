// fused_softmax: the forward kernels for float32 (softmax_forward.cuh; one unit per dtype, compiled in
// parallel), and forward()'s dispatch to each dtype's unit (here rather than in a unit of its own,
// which would cost another nvcc run's fixed seconds).
#include "softmax_forward.cuh"

namespace apex::fused_softmax {
template void forward_as<float>(const Cuda& device, const ForwardArgs& args);

void forward(const Cuda& device, const ForwardArgs& args) {
  if (args.rows == 0 || args.cols == 0) return;
  dispatch_floating<false>(args.dtype, [&](auto tag) { forward_as<typename decltype(tag)::type>(device, args); });
}
}  // namespace apex::fused_softmax
