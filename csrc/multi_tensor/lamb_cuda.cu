// CUDA kernels of LAMB (all variants) and NovoGrad.
#include <torch/library.h>

#include "apex/multi_tensor_apply.cuh"
#include "lamb.h"
#include "novograd.h"

TORCH_LIBRARY_IMPL(apex, CUDA, m) {
  apex::multi_tensor::register_lamb_kernels<apex::multi_tensor::CudaEngine>(m);
  apex::multi_tensor::register_novograd_kernels<apex::multi_tensor::CudaEngine>(m);
}
