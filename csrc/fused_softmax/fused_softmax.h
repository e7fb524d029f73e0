#pragma once
// fused_softmax: y = softmax(scale * x) over the last dimension of attention scores, with masked
// positions (a boolean mask, or the causal upper triangle) taking no part and getting y = 0 (a
// fully masked row is all zeros; -inf scores count as masked, so a row of them is zeros too, where
// torch.softmax gives NaN), and its backward grad_x = scale * y * (grad_y - sum(grad_y * y)).
// One set of kernels serves the four historical modules (scaled_softmax_cuda,
// scaled_masked_softmax_cuda, generic_scaled_masked_softmax_cuda,
// scaled_upper_triang_masked_softmax_cuda). What the kernels take, and the kernels.
#include "apex/device.h"
#include "apex/dtype.h"

namespace apex::fused_softmax {

// x and y: `rows` rows of `cols` elements, contiguous; row r = (b * heads + h) * queries + q.
struct ForwardArgs {
  const void* x;
  void* y;
  Dtype dtype;
  int64_t rows;
  int64_t cols;
  int64_t queries;  // rows per (batch, head): the query index of row r is r % queries
  int64_t heads;    // heads per batch (1 for 3-D input): only the mask's strides need it
  float scale;
  bool causal;      // row r keeps the columns j <= r % queries (queries == cols)
  // Element (b, h, q, j) is masked when mask[b * mask_batch_stride + h * mask_head_stride +
  // q * mask_query_stride + j] is nonzero (a stride of 0 broadcasts); null: no mask.
  const uint8_t* mask;
  int64_t mask_batch_stride;
  int64_t mask_head_stride;
  int64_t mask_query_stride;
};

// grad_y, y and grad_x: `rows` rows of `cols` elements, contiguous (a fresh grad_x: grad_y is
// never written).
struct BackwardArgs {
  const void* grad_y;
  const void* y;
  void* grad_x;
  Dtype dtype;
  int64_t rows;
  int64_t cols;
  int64_t queries;
  float scale;
  bool causal;  // y is known to be 0 above the diagonal: those columns are never read
};

void forward(const Cpu&, const ForwardArgs&);  // fused_softmax_cpu.cpp
void backward(const Cpu&, const BackwardArgs&);
void forward(const Cuda&, const ForwardArgs&);  // softmax_forward_float32.cu (kernels: softmax_forward.cuh)
void backward(const Cuda&, const BackwardArgs&);  // softmax_backward.cu

}  // namespace apex::fused_softmax
