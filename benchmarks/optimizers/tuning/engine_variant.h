// The functions engine_variant.cu builds with one engine variant (see tune_engine.py).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace tune {

using Lists = std::vector<at::TensorList>;

// AdamW (decoupled weight decay 0.01, betas 0.9/0.999, eps 1e-8) over lists [g, p, m, v] of float32 tensors.
void adamw(const at::Tensor& flag, const Lists& lists, double lr, int64_t step);
// (total L2 norm, per-tensor L2 norms) of lists [x] of float32 tensors.
std::vector<at::Tensor> l2norm(const at::Tensor& flag, const Lists& lists);
// out = in * factor over lists [in, out], flagging inf/nan inputs.
void scale(const at::Tensor& flag, const Lists& lists, double factor);
// Resident blocks per SM of the adamw, l2norm and scale kernels.
std::vector<int64_t> blocks_per_sm();

}  // namespace tune
