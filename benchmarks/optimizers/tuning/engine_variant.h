// The kernels engine_variant.cu builds with one variant of the CUDA engine (see tune_engine.py):
// amp_C's fp32 AdamW step, grad L2 norm and unscale. Torch-free, as every kernel header.
#pragma once

#include <vector>

#include "adam.h"
#include "l2norm.h"
#include "scale.h"

namespace tune {

using apex::Cuda;
using apex::multi_tensor::TensorLists;

void adamw(const Cuda& device, const TensorLists& lists, int* flag, const apex::multi_tensor::AdamFunctor& op);
void l2norm(const Cuda& device, const TensorLists& lists, int* flag, const apex::multi_tensor::NormArgs& args);
void scale(const Cuda& device, const TensorLists& lists, int* flag, const apex::multi_tensor::ScaleFunctor& op);
// Floats of scratch l2norm needs; resident blocks per SM of the adamw, l2norm and scale kernels.
int64_t scratch(const Cuda& device, int64_t count);
std::vector<int64_t> blocks_per_sm(const Cuda& device);

}  // namespace tune
