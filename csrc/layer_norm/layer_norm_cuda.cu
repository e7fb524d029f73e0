// Registers the CUDA kernels of apex's fused LayerNorm / RMSNorm with the dispatcher.

#include "layer_norm_cuda.cuh"

namespace apex::layer_norm {

TORCH_LIBRARY_IMPL(apex, CUDA, m) { register_kernels<cuda::forward_cuda, cuda::backward_cuda>(m); }

}  // namespace apex::layer_norm
