// CUDA kernels of multi_tensor_sgd.
#include <torch/library.h>

#include "apex/multi_tensor_apply.cuh"
#include "sgd.h"

TORCH_LIBRARY_IMPL(apex, CUDA, m) {
  apex::multi_tensor::register_sgd_kernels<apex::multi_tensor::CudaEngine>(m);
}
