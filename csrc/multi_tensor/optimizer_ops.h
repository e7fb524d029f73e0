// What the optimizer steps' registration units share (optimizer_ops.cpp: Adam, SGD, LARS, NovoGrad,
// Adagrad, RMSprop, Adadelta; lamb_ops.cpp: LAMB): the lists' checks and the step-count arguments.
// Two units, not one, so that ninja compiles them in parallel: each op registers its dispatcher
// wrappers (CPU, CUDA, Meta, the pybind face), and all eighteen ops in one unit took 12 s of one core.
#pragma once

#include <initializer_list>
#include <utility>
#include <vector>

#include "apex/multi_tensor_op.h"

namespace apex::multi_tensor {

// Optimizer lists: grads in the params' dtype, each state list float32 or the params' dtype, and
// all state lists of one dtype.
inline void check_optimizer_lists(const Lists& lists, const std::vector<int>& states) {
  check_same_dtype(lists, 0, 1);
  for (int state : states) check_state_dtype(lists, 1, state);
  for (size_t i = 1; i < states.size(); ++i) check_same_dtype(lists, states[0], states[i]);
}

// The lists of an optimizer step, checked as check_optimizer_lists does: [grads, params, states...],
// the grads read (and written, `grads_access`, where the op unscales or clips them in place), the
// params and every state list read and written.
inline Lists step_lists(const char* op, int64_t chunk_size, const at::Tensor& flag, at::TensorList grads,
                        at::TensorList params, std::initializer_list<ListArg> states,
                        Access grads_access = Access::kRead, bool allow_double = false) {
  std::vector<ListArg> args{{grads, "grads", grads_access}, {params, "params", Access::kReadWrite}};
  std::vector<int> state_lists;
  for (ListArg state : states) {
    state.access = Access::kReadWrite;
    state_lists.push_back(static_cast<int>(args.size()));
    args.push_back(state);
  }
  Lists lists(op, chunk_size, flag, std::move(args), allow_double);
  check_optimizer_lists(lists, state_lists);
  return lists;
}

inline void check_mode(const char* op, int64_t mode, const char* zero, const char* one) {
  APEX_CHECK(mode == 0 || mode == 1, op, ": mode must be 0 (", zero, ") or 1 (", one, "), got ", mode);
}

// A step count of 0 with bias correction divides by 1 - beta^0 = 0: refused where it is known
// (steps read by the kernel on the device are the caller's to keep >= 1).
inline void check_step(const char* op, double step, bool bias_correction) {
  APEX_CHECK(!bias_correction || step >= 1, op, ": step must be >= 1 (the first step is 1), got ", step);
}

inline ScalarArg step_arg(const char* op, const at::Tensor& step, const at::Tensor& flag, bool bias_correction,
                          std::vector<at::Tensor>& keep) {
  const ScalarArg arg = scalar_arg(step, flag, keep);
  if (arg.ptr == nullptr) {
    check_step(op, arg.value, bias_correction);
  } else if (step.is_cpu() && bias_correction) {
    for (int64_t t = 0; t < (arg.per_tensor ? step.numel() : 1); ++t) check_step(op, arg.ptr[t], true);
  }
  return arg;
}

}  // namespace apex::multi_tensor
