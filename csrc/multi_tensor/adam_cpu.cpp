// CPU kernels of Adam/AdamW (plain, capturable, capturable with master weights) and Adagrad.
#include <torch/library.h>

#include "adagrad.h"
#include "adam.h"
#include "apex/multi_tensor_apply_cpu.h"

TORCH_LIBRARY_IMPL(apex, CPU, m) {
  apex::multi_tensor::register_adam_kernels<apex::multi_tensor::CpuEngine>(m);
  apex::multi_tensor::register_adagrad_kernels<apex::multi_tensor::CpuEngine>(m);
}
