// fused_dense: the GEMMs of gemm.h, compiled once for Cpu and (GPU builds) Cuda.
#include "gemm.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>

#include <algorithm>
#include <optional>
#include <type_traits>

#include "apex/op.h"
#include "apex/torch_scratch.h"
#include "bias_grad.h"

namespace apex::fused_dense {
namespace {

template <class Device>
constexpr bool kIsCuda = std::is_same_v<Device, Cuda>;

Dtype dtype_of(const at::Tensor& t) { return floating_dtype(t, "fused_dense", "operand"); }

// out = activation(input), both contiguous [rows, cols] (or the same tensor).
template <class Device>
void activate_into(const Device& device, const at::Tensor& input, const at::Tensor& out, Activation activation) {
  apply_activation(device, ActivationArgs{input.const_data_ptr(), out.mutable_data_ptr(), out.numel(), dtype_of(out),
                                          activation});
}

#ifdef APEX_WITH_CUDA
// ---- cuBLASLt problems -------------------------------------------------------------------------

// A 2-D tensor as BLAS reads it: row-major, or a transposed view of row-major data; any other
// layout (broadcast rows, two non-unit strides) is copied once.
struct BlasOperand {
  at::Tensor tensor;
  LtOperand view;
};

BlasOperand blas_operand(const at::Tensor& m) {
  const int64_t rows = m.size(0), cols = m.size(1);
  if (m.stride(1) == 1 && (rows <= 1 || m.stride(0) >= std::max<int64_t>(cols, 1))) {
    return {m, {m.const_data_ptr(), false, std::max<int64_t>({m.stride(0), cols, 1})}};
  }
  if (m.stride(0) == 1 && (cols <= 1 || m.stride(1) >= std::max<int64_t>(rows, 1))) {
    return {m, {m.const_data_ptr(), true, std::max<int64_t>({m.stride(1), rows, 1})}};
  }
  const at::Tensor copy = m.contiguous();
  return {copy, {copy.const_data_ptr(), false, std::max<int64_t>(cols, 1)}};
}

bool row_major(const at::Tensor& m) { return m.stride(1) == 1 && (m.size(0) <= 1 || m.stride(0) >= m.size(1)); }

bool lt_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// cuBLASLt's GELU aux matrix: row-major [rows, cols] with a leading dimension divisible by 8, at a
// 16-byte aligned address like every matrix cuBLASLt's vectorized epilogues read.
constexpr int64_t kAuxLdMultiple = 8;
constexpr uintptr_t kAuxAlignment = 16;
bool lt_aux(const at::Tensor& aux) {
  return aux.is_contiguous() && aux.size(1) % kAuxLdMultiple == 0 &&
         reinterpret_cast<uintptr_t>(aux.const_data_ptr()) % kAuxAlignment == 0;
}

// out[rows, cols] = a @ b for cuBLASLt, the operands kept alive beside it; none when cuBLASLt
// cannot take the problem (dtypes, empty sizes, an output that is not row-major).
struct LtProblem {
  BlasOperand a, b;
  LtMatmul matmul;
};

std::optional<LtProblem> lt_problem(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  if (!lt_dtype(a.scalar_type()) || b.scalar_type() != a.scalar_type() || !lt_dtype(out.scalar_type())) return {};
  if (a.size(0) == 0 || a.size(1) == 0 || b.size(1) == 0 || !row_major(out)) return {};
  LtProblem problem{blas_operand(a), blas_operand(b), {}};
  LtMatmul& m = problem.matmul;
  m.rows = a.size(0);
  m.cols = b.size(1);
  m.depth = a.size(1);
  m.a = problem.a.view;
  m.b = problem.b.view;
  m.input_dtype = dtype_of(a);
  m.out = out.mutable_data_ptr();
  m.ld_out = std::max<int64_t>({out.stride(0), m.cols, 1});
  m.out_dtype = dtype_of(out);
  m.accumulate = false;
  m.epilogue = LtEpilogue::kNone;
  return problem;
}

// The forward as one cuBLASLt call whose epilogue adds the bias and applies ReLU or tanh-GELU (writing
// the pre-activation as GELU's aux output); an activation it lacks (exact GELU, sigmoid) follows as one
// elementwise pass over the GEMM's output. Its GELU serves 16-bit data only: float32 results take the
// elementwise pass, torch's formula in float32 (cuBLASLt documents no accuracy for its epilogue's tanh;
// the pass costs little beside a float32 GEMM). False, having launched nothing, where it has no part.
bool lt_forward(const Cuda& device, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                const at::Tensor* bias, Activation activation, const at::Tensor* pre_activation) {
  if (bias == nullptr && activation == Activation::kNone) return false;  // a plain GEMM: ATen's
  auto problem = lt_problem(a, b, out);
  if (!problem) return false;
  LtMatmul& m = problem->matmul;
  const bool with_bias = bias != nullptr;
  m.bias = with_bias ? bias->const_data_ptr() : nullptr;
  const bool lt_gelu = activation == Activation::kGeluTanh && m.input_dtype != Dtype::kFloat32;
  const at::Tensor* target = &out;  // what the GEMM writes
  bool activation_after = false;
  if (pre_activation == nullptr && activation == Activation::kNone) {
    m.epilogue = LtEpilogue::kBias;
  } else if (pre_activation == nullptr && activation == Activation::kRelu) {
    m.epilogue = with_bias ? LtEpilogue::kBiasRelu : LtEpilogue::kRelu;
  } else if (pre_activation == nullptr && lt_gelu) {
    m.epilogue = with_bias ? LtEpilogue::kBiasGelu : LtEpilogue::kGelu;
  } else if (pre_activation != nullptr && lt_gelu && lt_aux(*pre_activation)) {
    m.epilogue = with_bias ? LtEpilogue::kBiasGeluAux : LtEpilogue::kGeluAux;
    m.aux = pre_activation->mutable_data_ptr();
    m.ld_aux = pre_activation->size(1);
  } else if (with_bias) {
    m.epilogue = LtEpilogue::kBias;
    activation_after = true;
    if (pre_activation != nullptr) target = pre_activation;
  } else {
    return false;  // nothing for the epilogue: ATen's GEMM, then the elementwise pass
  }
  m.out = target->mutable_data_ptr();
  if (!lt_matmul(device, m)) return false;
  if (activation_after) activate_into(device, *target, out, activation);
  return true;
}

// out += a @ b in one cuBLASLt call: 16-bit products accumulated into a float32 out.
bool lt_accumulate(const Cuda& device, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  auto problem = lt_problem(a, b, out);
  if (!problem) return false;
  problem->matmul.accumulate = true;
  return lt_matmul(device, problem->matmul);
}
#endif  // APEX_WITH_CUDA

}  // namespace

void matmul(const at::Tensor& a, const at::Tensor& b, at::Tensor out) { at::mm_out(out, a, b); }

template <class Device>
void matmul_bias_activation(const Device& device, const at::Tensor& a, const at::Tensor& b, at::Tensor out,
                            const at::Tensor* bias, Activation activation, const at::Tensor* pre_activation) {
#ifdef APEX_WITH_CUDA
  if constexpr (kIsCuda<Device>) {
    if (lt_forward(device, a, b, out, bias, activation, pre_activation)) return;
  }
#endif
  // ATen's GEMM adds the bias before its one rounding to the output dtype, as cuBLASLt's epilogue does
  // (a product rounded before the bias is added would be one rounding more than the fused path's).
  at::Tensor target = pre_activation != nullptr ? *pre_activation : out;
  if (bias != nullptr) {
    at::addmm_out(target, *bias, a, b);
  } else {
    at::mm_out(target, a, b);
  }
  if (activation != Activation::kNone || pre_activation != nullptr) activate_into(device, target, out, activation);
}

template <class Device>
void matmul_activation_grad(const Device& device, const at::Tensor& a, const at::Tensor& b, at::Tensor out,
                            Activation activation, const at::Tensor& saved, const at::Tensor* grad_bias) {
  at::mm_out(out, a, b);
  pre_activation_grads(device, out, saved, activation, &out, grad_bias);
}

template <class Device>
void pre_activation_grads(const Device& device, const at::Tensor& grad, const at::Tensor& saved,
                          Activation activation, const at::Tensor* grad_input, const at::Tensor* grad_bias) {
  const bool none = activation == Activation::kNone;
  APEX_CHECK(grad.dim() == 2 && grad.is_contiguous() &&
                 (none || (saved.sizes() == grad.sizes() && saved.is_contiguous())),
             "fused_dense: pre_activation_grads takes contiguous 2-D grad and saved of one shape");
  // The identity's derivative in place: grad_input already holds it.
  const bool writes = grad_input != nullptr && !(none && grad_input->const_data_ptr() == grad.const_data_ptr());
  // kNone's derivative ignores saved's values (the elementwise kernel still reads them): grad stands in.
  const void* saved_data = none ? grad.const_data_ptr() : saved.const_data_ptr();
  if (grad_bias == nullptr) {
    if (!writes) return;
    activation_grad(device, ActivationGradArgs{grad.const_data_ptr(), saved_data, grad_input->mutable_data_ptr(),
                                               grad.numel(), dtype_of(grad), activation});
    return;
  }
  if (none && !writes) {  // a column sum alone: ATen's reads at copy speed (H200, 8192x16384 bf16: 88% of copy,
                          // this pass 54%: its row tiles are built for the write beside the read)
    at::Tensor bias = *grad_bias;
    at::sum_out(bias, grad, {0});
    return;
  }
  at::Tensor workspace;  // held until the kernels are queued: the caching allocator reuses it in stream order
  activation_bias_grad(device,
                       ActivationBiasGradArgs{grad.const_data_ptr(), saved_data,
                                              writes ? grad_input->mutable_data_ptr() : nullptr,
                                              grad_bias->mutable_data_ptr(), grad.size(0), grad.size(1),
                                              dtype_of(grad), activation},
                       torch_scratch(grad, workspace));
}

void linear_param_grads(const at::Tensor& grad, const at::Tensor& input, const at::Tensor* grad_weight,
                        const at::Tensor* grad_bias) {
  if (grad_weight != nullptr) {
    at::Tensor weight = *grad_weight;
    at::mm_out(weight, grad.t(), input);
  }
  if (grad_bias != nullptr) {
    at::Tensor bias = *grad_bias;
    at::sum_out(bias, grad, {0});
  }
}

template <class Device>
void accumulate_weight_grad(const Device& device, const at::Tensor& grad, const at::Tensor& input,
                            at::Tensor main_grad) {
  const bool widening = main_grad.scalar_type() != grad.scalar_type();
#ifdef APEX_WITH_CUDA
  if constexpr (kIsCuda<Device>) {
    if (widening && lt_accumulate(device, grad.t(), input, main_grad)) return;
  }
#endif
  // Products of 16-bit data into a float32 main_grad are taken in float32 (one rounding, as cuBLASLt's).
  const at::ScalarType type = main_grad.scalar_type();
  main_grad.addmm_(widening ? grad.t().to(type) : grad.t(), widening ? input.to(type) : input);
}

// Each device's GEMMs, for the op functions in the other files.
#define APEX_FUSED_DENSE_GEMMS(Device)                                                                           \
  template void matmul_bias_activation<Device>(const Device&, const at::Tensor&, const at::Tensor&, at::Tensor, \
                                               const at::Tensor*, Activation, const at::Tensor*);              \
  template void matmul_activation_grad<Device>(const Device&, const at::Tensor&, const at::Tensor&, at::Tensor, \
                                               Activation, const at::Tensor&, const at::Tensor*);              \
  template void pre_activation_grads<Device>(const Device&, const at::Tensor&, const at::Tensor&, Activation,    \
                                             const at::Tensor*, const at::Tensor*);                            \
  template void accumulate_weight_grad<Device>(const Device&, const at::Tensor&, const at::Tensor&, at::Tensor);

APEX_FUSED_DENSE_GEMMS(Cpu)
#ifdef APEX_WITH_CUDA
APEX_FUSED_DENSE_GEMMS(Cuda)
#endif

}  // namespace apex::fused_dense
