#pragma once
// The op pattern: an op function is written once, as a struct with its schema and one function
// template over the device, and everything else follows from it:
//
//   struct Scale {
//     static constexpr const char* kSchema = "my_op_scale(Tensor x, float alpha) -> Tensor";
//     template <class Device>
//     static at::Tensor call(const at::Tensor& x, double alpha) {
//       const Dtype dtype = floating_dtype(x, "my_op_scale", "x");   // checks, before any launch
//       at::Tensor input = x.contiguous(), out = at::empty_like(input);
//       launch<Device>(input, [&](const auto& device) {                // Meta: skipped
//         scale(device, ScaleArgs{input.const_data_ptr(), out.mutable_data_ptr(), input.numel(), dtype, alpha});
//       });
//       return out;
//     }
//   };
//   APEX_LIBRARY(m) { apex::define<Scale>(m); }
//
// define<Scale> declares the schema in the `apex` dispatcher namespace (torch.ops.apex.my_op_scale)
// and registers call<Cpu> for CPU, call<Cuda> for CUDA (GPU builds only: -DAPEX_WITH_CUDA) and
// call<Meta> for Meta. The Meta kernel runs the real argument checks and allocations without
// launching anything, so it is the shape function torch.compile / torch.export use, and a call that
// mixes devices (a weight left on the meta device) fails the same device check as on any device.
// Shape code must therefore accept symbolic sizes: use sym_sizes()/sym_numel() and the *_symint
// allocation functions before launch<>, and plain sizes only inside the launched lambda.
//
// apex::call_op<Scale>(x, alpha) calls the op through the dispatcher (a cached, typed handle): what
// an autograd formula or another op uses. Differentiable ops: apex/autograd.h.

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "apex/check.h"
#include "apex/device.h"
#include "apex/dtype.h"

// The block that declares and registers a source file's ops: APEX_LIBRARY(m) { apex::define<Op>(m); }
#define APEX_LIBRARY(m) TORCH_LIBRARY_FRAGMENT(apex, m)

namespace apex {

// ---- running a kernel ------------------------------------------------------------------------

// Calls kernel(device) with the Device that `on` lives on (guarded current, its current stream),
// or does nothing for Meta: the op function's checks and allocations are all the Meta kernel does.
// Kernels run below autograd: ATen ops a kernel calls (at::mm_out into an output, say) never record
// or refuse autograd work, also when the op itself was called with tensors that require grad
// through an Autograd::kNever fallthrough.
template <class Device, class Kernel>
void launch(const at::Tensor& on, Kernel&& kernel) {
  if constexpr (std::is_same_v<Device, Cpu>) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    kernel(Cpu{});
  } else if constexpr (std::is_same_v<Device, Cuda>) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    const c10::DeviceGuard guard(on.device());
    const c10::Stream stream = c10::impl::getDeviceGuardImpl(on.device().type())->getStream(on.device());
    Cuda cuda;
    cuda.stream = stream.native_handle();
    cuda.device = on.device().index();
    kernel(cuda);
  } else {
    static_assert(std::is_same_v<Device, Meta>, "apex::launch: Device is Cpu, Cuda or Meta");
  }
}

// ---- argument checks shared by ops -----------------------------------------------------------

// The kernel Dtype of `t`, refusing what no apex kernel computes in.
inline Dtype floating_dtype(const at::Tensor& t, const char* op, const char* what, bool allow_double = true) {
  switch (t.scalar_type()) {
    case at::kFloat: return Dtype::kFloat32;
    case at::kHalf: return Dtype::kFloat16;
    case at::kBFloat16: return Dtype::kBFloat16;
    case at::kDouble:
      if (allow_double) return Dtype::kFloat64;
      break;
    default:
      break;
  }
  APEX_CHECK(false, op, ": ", what, " must be float32, float16 or bfloat16", allow_double ? " (or float64)" : "",
             ", got ", t.scalar_type());
  return Dtype::kFloat32;  // unreachable
}

// Statistics (means, variances, norms) of 16-bit and float32 data are float32; of float64, float64.
inline at::ScalarType statistics_dtype(at::ScalarType data) {
  return data == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_same_device(const at::Tensor& t, const at::Tensor& like, const char* op, const char* what,
                              const char* like_what) {
  APEX_CHECK(t.device() == like.device(), op, ": ", what, " is on ", t.device(), " but ", like_what, " is on ",
             like.device());
}

// ---- declaring ops ---------------------------------------------------------------------------

namespace detail {

inline std::string op_name(std::string_view schema) { return std::string(schema.substr(0, schema.find('('))); }

// The op's C++ signature, taken from its one declaration.
template <class Op>
using Signature = std::remove_pointer_t<decltype(&Op::template call<Cpu>)>;

// Declares Op's schema and registers its CPU, Meta and (GPU builds) CUDA kernels; returns the op's
// name. Its Autograd kernel is registered by the caller, once (a second registration for the same
// key replaces the first with a warning on torch before 2.14).
template <class Op>
std::string declare(torch::Library& m) {
  std::string name = op_name(Op::kSchema);
  m.def(Op::kSchema);
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(Op::template call<Cpu>)));
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(Op::template call<Meta>)));
#ifdef APEX_WITH_CUDA
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(Op::template call<Cuda>)));
#endif
  return name;
}

}  // namespace detail

// What autograd does with an op that has no formula.
enum class Autograd {
  // The op is never differentiated (an optimizer step, grad housekeeping): the dispatcher goes
  // straight to the kernel even when inputs require grad, and outputs never require grad. Without
  // this, torch's boxed not-implemented fallback runs on every call (measured: +180 us for a
  // multi-tensor call over two 289-tensor lists).
  kNever,
  // Differentiating through the op raises "not implemented" (backward kernels without a
  // double-backward formula). torch's default for an op without an Autograd kernel would only warn
  // and hand back wrong (missing) gradients.
  kNotImplemented,
};

// Declares Op's schema and registers its CPU, Meta and (GPU builds) CUDA kernels.
template <class Op>
void define(torch::Library& m, Autograd autograd = Autograd::kNotImplemented) {
  const std::string name = detail::declare<Op>(m);
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::Autograd,
                                       autograd == Autograd::kNever ? torch::CppFunction::makeFallthrough()
                                                                    : torch::autograd::autogradNotImplementedFallback()));
}

// An op made of other ops only (views, ATen calls): Op::call, a plain function, serves every
// device, Meta included, and autograd differentiates through what it calls.
template <class Op>
void define_composite(torch::Library& m) {
  m.def(Op::kSchema);
  m.impl(detail::op_name(Op::kSchema).c_str(),
         torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(Op::call)));
}

// Declares <op>_output: Op's first output alone (same arguments, "-> Tensor"), a composite of Op, so
// Op's autograd formula applies. For eager calls from Python, which otherwise wrap every output of a
// multi-output op in a Python object only to drop all but the first (measured on a CPU LayerNorm:
// 0.3 us of a forward, ~1 us of a forward + backward).
template <class Op>
void define_first_output(torch::Library& m);

// ---- calling ops -----------------------------------------------------------------------------

// Calls Op through the dispatcher (autograd, tracing and the device's kernel all apply), through
// a handle looked up once.
template <class Op, class... Args>
decltype(auto) call_op(Args&&... args) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow(("apex::" + detail::op_name(Op::kSchema)).c_str(), "")
                                 .template typed<detail::Signature<Op>>();
  return handle.call(std::forward<Args>(args)...);
}

namespace detail {
template <class Op, class Sig>
struct FirstOutput;
template <class Op, class Ret, class... Args>
struct FirstOutput<Op, Ret(Args...)> {
  static at::Tensor call(Args... args) { return std::get<0>(call_op<Op>(args...)); }
};
}  // namespace detail

template <class Op>
void define_first_output(torch::Library& m) {
  const std::string_view schema = Op::kSchema;
  const size_t arguments = schema.find('('), returns = schema.rfind("->");
  const std::string name = detail::op_name(schema) + "_output";
  m.def((name + std::string(schema.substr(arguments, returns - arguments)) + "-> Tensor").c_str());
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd,
                                       TORCH_FN((detail::FirstOutput<Op, detail::Signature<Op>>::call))));
}

}  // namespace apex
