// CPU kernels of LAMB (all variants) and NovoGrad.
#include <torch/library.h>

#include "apex/multi_tensor_apply_cpu.h"
#include "lamb.h"
#include "novograd.h"

TORCH_LIBRARY_IMPL(apex, CPU, m) {
  apex::multi_tensor::register_lamb_kernels<apex::multi_tensor::CpuEngine>(m);
  apex::multi_tensor::register_novograd_kernels<apex::multi_tensor::CpuEngine>(m);
}
