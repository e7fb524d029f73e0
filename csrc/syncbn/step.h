#pragma once
// syncbn: one process's step, one differentiable op (training: step_train.cpp; eval: step_eval.cpp)
// and one backward op (step_backward.cpp), each registered by a unit of its own so that a build
// compiles them side by side (benchmarks/build/NOTES.md, session 31).
//
// Without a collective between the kernels, a step of one process needs no autograd.Function: each
// forward is one op whose formula runs in C++, and its backward one op, as torch's BatchNorm, so that
// the host pays what it pays for torch's (one dispatch each way, no count tensor to fill, running
// statistics updated by the kernel that computes the batch statistics).
//
// Layouts: `channels_last` runs the channels-innermost kernels on a (*, C) input; with `permuted`,
// the input (and z) is (N, C, *) stored channels_last, whose memory those kernels read as it is (no
// view, no copy), and the output is (N, C, *) stored channels_last too (KernelOrder). z and fuse_relu
// need channels_last.
#include <array>
#include <tuple>

#include "apex/autograd.h"
#include "op_functions.h"

namespace apex::syncbn {

inline void check_step_layout(const char* op, const OptionalTensor& z, bool channels_last, bool permuted,
                              bool fuse_relu) {
  APEX_CHECK(!permuted || channels_last, op, ": permuted inputs are read channels-last");
  APEX_CHECK(channels_last || (!defined(z) && !fuse_relu), op, ": z and fuse_relu need channels_last");
}

// What both forward ops keep for the shared backward (StepBackward): the input and z as given, the
// statistics the output was normalized with, the parameters.
inline void save_step(AutogradContext& ctx, const Tensor& input, const OptionalTensor& z,
                      const OptionalTensor& weight, const OptionalTensor& bias, const Tensor& mean,
                      const Tensor& inv_std, bool batch_statistics, bool channels_last, bool permuted,
                      bool fuse_relu) {
  ctx.save_for_backward({input, z.value_or(Tensor()), weight.value_or(Tensor()), bias.value_or(Tensor()), mean,
                         inv_std});
  ctx.saved_data["batch_stats"] = batch_statistics;
  ctx.saved_data["channels_last"] = channels_last;
  ctx.saved_data["permuted"] = permuted;
  ctx.saved_data["fuse_relu"] = fuse_relu;
  ctx.set_materialize_grads(false);
}

// The backward of either forward op (its Autograd formula): calls StepBackward.
Grads step_grads(AutogradContext& ctx, const Grads& grads);

// The gradients of either forward op: (grad_input, grad_z, grad_weight, grad_bias), each computed
// only when asked (else empty). Operands and gradients in the forward's layout (see the
// header's comment); grad_weight / grad_bias in weight's dtype, empty without a weight.
struct StepBackward {
  static constexpr const char* kSchema =
      "syncbn_batch_norm_bwd(Tensor grad_output, Tensor input, Tensor? z, Tensor? weight, Tensor? bias, Tensor mean, "
      "Tensor inv_std, bool batch_statistics, bool channels_last, bool permuted, bool fuse_relu, "
      "bool[3] output_mask) -> (Tensor grad_input, Tensor grad_z, Tensor grad_weight, Tensor grad_bias)";

  template <class Device>
  static std::tuple<Tensor, Tensor, Tensor, Tensor> call(const Tensor& grad_output, const Tensor& input,
                                                         const OptionalTensor& z, const OptionalTensor& weight,
                                                         const OptionalTensor& bias, const Tensor& mean,
                                                         const Tensor& inv_std, bool batch_statistics,
                                                         bool channels_last, bool permuted, bool fuse_relu,
                                                         std::array<bool, 3> output_mask);
};

}  // namespace apex::syncbn
