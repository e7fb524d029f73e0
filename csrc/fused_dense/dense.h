#pragma once
// fused_dense: GEMMs with fused forward epilogues (bias, ReLU, tanh GELU) for apex.fused_dense,
// apex.mlp and Megatron's weight-gradient accumulation. What the kernels take (plain structs) and
// the kernels, one overload per device. Kernel sources include this and apex's light headers only.
//
// Matrices are described in row-major terms, as torch stores them: a linear layer is
// out[tokens, out_features] = x[tokens, in_features] @ weight^T + bias[out_features].
#include <cstdint>

#include "apex/device.h"
#include "apex/dtype.h"

namespace apex::fused_dense {

// The activation after a layer's bias. Upstream apex.mlp numbers them (0 none, 1 relu, 2 sigmoid).
enum class Activation : int8_t { kNone, kRelu, kSigmoid, kGelu, kGeluTanh };

// output = activation(input) over n contiguous elements (the bias is the GEMM's). output may alias input.
struct ActivationArgs {
  const void* input;
  void* output;
  int64_t n;
  Dtype dtype;
  Activation activation;
};

// grad_input = grad * activation'(saved) over n contiguous elements, where saved is the
// activation's input for GELU and its output for ReLU and sigmoid (what each derivative is cheapest
// from). grad_input may alias grad.
struct ActivationGradArgs {
  const void* grad;
  const void* saved;
  void* grad_input;
  int64_t n;
  Dtype dtype;
  Activation activation;
};

void apply_activation(const Cpu&, const ActivationArgs&);  // dense_cpu.cpp
void activation_grad(const Cpu&, const ActivationGradArgs&);
void apply_activation(const Cuda&, const ActivationArgs&);  // dense_cuda.cu
void activation_grad(const Cuda&, const ActivationGradArgs&);

// ---- cuBLASLt (GPU builds) -------------------------------------------------------------------

// What cuBLASLt fuses into a forward GEMM's epilogue. Its GELU is the tanh approximation.
enum class LtEpilogue : int8_t {
  kNone,
  kBias,         // out = a @ b + bias
  kRelu,         // out = relu(a @ b)
  kBiasRelu,     // out = relu(a @ b + bias)
  kGelu,         // out = gelu_tanh(a @ b)
  kBiasGelu,     // out = gelu_tanh(a @ b + bias)
  kGeluAux,      // aux = a @ b,        out = gelu_tanh(aux)
  kBiasGeluAux,  // aux = a @ b + bias, out = gelu_tanh(aux)
};

// A GEMM operand [rows, cols]: element (r, c) at data[r * ld + c], or, transposed, at data[c * ld + r].
struct LtOperand {
  const void* data;
  bool transposed;
  int64_t ld;
};

// out[rows, cols] (+)= a[rows, depth] @ b[depth, cols], then the epilogue. out is row-major with
// leading dimension ld_out; bias and aux (row-major, ld_aux) have out_dtype.
struct LtMatmul {
  int64_t rows;
  int64_t cols;
  int64_t depth;
  LtOperand a;
  LtOperand b;
  Dtype input_dtype;  // of a and b
  void* out;
  int64_t ld_out;
  Dtype out_dtype;    // input_dtype, or float32 (16-bit products accumulated into float32)
  bool accumulate;    // out += a @ b instead of out = a @ b
  LtEpilogue epilogue;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t ld_aux = 0;
};

// Runs the GEMM through cuBLASLt with torch's handle and workspace on the device's stream. Returns
// false, having launched nothing, when cuBLASLt offers no algorithm for it (the caller then
// computes it another way); raises on a failed launch. Defined in GPU builds only (cublaslt.cpp).
bool lt_matmul(const Cuda&, const LtMatmul&);

}  // namespace apex::fused_dense
