// fused_dense: Megatron's gradient-accumulation fusion (NVIDIA apex's fused_weight_gradient_mlp_cuda):
// main_grad += d_output^T @ input in one GEMM, main_grad float32 (wgrad_gemm_accum_fp32) or of the
// inputs' dtype (wgrad_gemm_accum_fp16, which takes bfloat16 too).
#include "apex/op.h"
#include "arguments.h"
#include "gemm.h"

namespace apex::fused_dense {

template <bool kFloat32MainGrad>
struct WgradAccumulate {
  static constexpr const char* kSchema =
      kFloat32MainGrad
          ? "fused_weight_gradient_mlp_wgrad_gemm_accum_fp32(Tensor input, Tensor d_output, Tensor(a!) main_grad) -> ()"
          : "fused_weight_gradient_mlp_wgrad_gemm_accum_fp16(Tensor input, Tensor d_output, Tensor(a!) main_grad) -> ()";

  // input [..., in_features], d_output [..., out_features] with the same leading sizes, main_grad
  // [out_features, in_features] (any strides).
  template <class Device>
  static void call(const at::Tensor& input, const at::Tensor& d_output, const at::Tensor& main_grad) {
    const char* op = kFloat32MainGrad ? "wgrad_gemm_accum_fp32" : "wgrad_gemm_accum_fp16";
    check_input(op, "input", input);
    APEX_CHECK(main_grad.dim() == 2, op, ": main_grad must be 2-D [out_features, in_features], got shape ",
               main_grad.sym_sizes());
    check_grad(op, "d_output", d_output, input, main_grad.sym_size(0));
    APEX_CHECK(main_grad.sym_size(1) == input.sym_size(-1), op, ": main_grad must have ", input.sym_size(-1),
               " columns (input's features), got shape ", main_grad.sym_sizes());
    const at::ScalarType wanted = kFloat32MainGrad ? at::kFloat : input.scalar_type();
    APEX_CHECK(main_grad.scalar_type() == wanted, op, ": main_grad must be ", wanted, ", got ",
               main_grad.scalar_type());
    check_same_device(main_grad, input, op, "main_grad", "input");
    launch<Device>(input, [&](const auto& device) {
      accumulate_weight_grad(device, as_matrix(d_output), as_matrix(input), main_grad);
    });
  }
};

APEX_LIBRARY(m) {
  define<WgradAccumulate<true>>(m, Autograd::kNever);
  define<WgradAccumulate<false>>(m, Autograd::kNever);
}

}  // namespace apex::fused_dense
