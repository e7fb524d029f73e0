// CPU kernels of multi_tensor_sgd.
#include <torch/library.h>

#include "apex/multi_tensor_apply_cpu.h"
#include "sgd.h"

TORCH_LIBRARY_IMPL(apex, CPU, m) {
  apex::multi_tensor::register_sgd_kernels<apex::multi_tensor::CpuEngine>(m);
}
