// CPU kernels of the L2-norm family.
#include <torch/library.h>

#include "apex/multi_tensor_apply_cpu.h"
#include "l2norm.h"

TORCH_LIBRARY_IMPL(apex, CPU, m) {
  apex::multi_tensor::register_l2norm_kernels<apex::multi_tensor::CpuEngine>(m);
}
