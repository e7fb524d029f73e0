// CUDA kernels of amp's multi-tensor ops: scale, axpby, and the loss-scale update.
#include <torch/library.h>

#include "apex/multi_tensor_apply.cuh"
#include "scale.h"
#include "update_scale_hysteresis.h"

TORCH_LIBRARY_IMPL(apex, CUDA, m) {
  apex::multi_tensor::register_scale_kernels<apex::multi_tensor::CudaEngine>(m);
  apex::multi_tensor::register_update_scale_kernels<apex::multi_tensor::CudaEngine>(m);
}
