#pragma once
// fused_dense: the GEMMs every dense layer is made of, each with what is fused into it. The op
// functions (linear.cpp, gelu_dense.cpp, mlp.cpp, wgrad.cpp) call them inside launch<> with real 2-D
// tensors; they are compiled once, in gemm.cpp, for Cpu and (GPU builds) Cuda.
//
//   matmul                  plain GEMM       out = a @ b
//   matmul_bias_activation  forward          out = activation(a @ b + bias)
//   matmul_activation_grad  data gradient    out = (a @ b) * activation'(saved), and the bias gradient
//                                            (column sums of out) in the same pass over out
//   pre_activation_grads    (no GEMM)        that pass alone, for a gradient no GEMM produced (the MLP's output)
//   linear_param_grads      weight, bias     grad^T @ input, column sums of grad
//   accumulate_weight_grad  Megatron's wgrad main_grad += grad^T @ input (float32 main_grad for 16-bit data)
//
// Only the forward fuses its epilogue into the GEMM (one cuBLASLt call: bias, ReLU, tanh-GELU with the
// pre-activation saved as its aux output): measured on an H100 it runs at 93-100% of the torch.matmul
// ceiling at tokens x hidden 8192x4096 and above. cuBLASLt's backward epilogues measured slower than torch's own GEMM plus one
// memory pass: with the bias gradient in the weight-gradient GEMM (BGRADB), bf16 Linear 8192 -> 32768 on
// 16384 tokens took 47.2 ms forward+backward against torch eager's 38.1 ms (ceiling 36.6 ms), and the
// tanh-GELU backward with DGELU_BGRAD lost 0.14 ms (4096x1024) to 0.5 ms (8192x4096) to the unfused
// exact-GELU path, while the pass a backward epilogue saves costs about 1% of the GEMM. So backward GEMMs
// are ATen's (torch.matmul's cuBLAS call: the ceiling; without eager's copies of transposed weight
// gradients), followed, where a layer has an activation or a bias, by one elementwise pass of apex's own
// (bias_grad.h): the activation derivative and the bias gradient together, one read of the GEMM's output
// and the saved activation, one write, deterministic (torch eager runs two passes, the bias gradient's
// a second read; torch.compile fuses the two as this pass does). A plain linear layer's bias gradient
// (no activation: linear_param_grads) stays ATen's column sum, a pass of its own either way.
#include <ATen/core/Tensor.h>

#include "apex/device.h"
#include "dense.h"

namespace apex::fused_dense {

// out = a @ b: ATen's GEMM (torch.matmul's call), any strides; out [rows, cols] of a's dtype.
void matmul(const at::Tensor& a, const at::Tensor& b, at::Tensor out);

// out = activation(a @ b + bias), and pre_activation = a @ b + bias when given (what backward reads).
// a [rows, depth], b [depth, cols] with any strides; out and pre_activation contiguous [rows, cols];
// bias contiguous [cols] or none; all of one dtype.
template <class Device>
void matmul_bias_activation(const Device& device, const at::Tensor& a, const at::Tensor& b, at::Tensor out,
                            const at::Tensor* bias, Activation activation, const at::Tensor* pre_activation);

// out = (a @ b) * activation'(saved), saved contiguous [rows, cols] as ActivationGradArgs says (the
// pre-activation for GELU, the activation's output for ReLU and sigmoid); out contiguous. With grad_bias
// (contiguous [cols]), also grad_bias = out summed over rows, in the same pass (pre_activation_grads).
template <class Device>
void matmul_activation_grad(const Device& device, const at::Tensor& a, const at::Tensor& b, at::Tensor out,
                            Activation activation, const at::Tensor& saved, const at::Tensor* grad_bias);

// The gradients at a layer's pre-activation from grad [rows, cols], the gradient at its output:
// grad_input = grad * activation'(saved) and grad_bias = grad_input summed over rows (of the values as
// rounded to the dtype, as eager's grad_input.sum(0)), each when given; one pass (bias_grad.h). grad,
// saved and grad_input contiguous, grad_input may be grad itself (in place; with kNone it is then not
// written); grad_bias contiguous [cols]. saved is not read for kNone.
template <class Device>
void pre_activation_grads(const Device& device, const at::Tensor& grad, const at::Tensor& saved,
                          Activation activation, const at::Tensor* grad_input, const at::Tensor* grad_bias);

// A linear layer's parameter gradients from its output gradient grad [tokens, out] and its input
// [tokens, in]: grad_weight [out, in] = grad^T @ input and grad_bias [out] = grad summed over tokens,
// each when given.
void linear_param_grads(const at::Tensor& grad, const at::Tensor& input, const at::Tensor* grad_weight,
                        const at::Tensor* grad_bias);

// main_grad [out, in] += grad^T @ input; main_grad float32 (16-bit grad and input: products accumulated
// in float32, one cuBLASLt call) or of their dtype; any strides.
template <class Device>
void accumulate_weight_grad(const Device& device, const at::Tensor& grad, const at::Tensor& input,
                            at::Tensor main_grad);

}  // namespace apex::fused_dense
