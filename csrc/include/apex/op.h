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
//
// define_first_output<Op> (an op's first output alone, for eager Python calls) also gives that op a
// typed Python entry (below, "typed Python entry"), which apex._ops.eager_op returns.

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "apex/check.h"
#include "apex/device.h"
#include "apex/dtype.h"
#include "apex/python_entry.h"  // <Python.h> and the typed Python entry's calls into torch's bindings

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

// ---- the typed Python entry ------------------------------------------------------------------
//
// Python reaches a custom op through torch.ops or torch._C._dispatch_call_boxed: both convert every
// argument to an IValue by the schema, call the op boxed and convert the outputs back, ~1 us of a
// ~3 us CPU LayerNorm call that torch's own ops, with generated typed bindings, do not pay. An
// <op>_output op (define_first_output) therefore also gets a typed entry: a METH_FASTCALL function
// that converts its arguments straight to the op's C++ types and calls the op's typed handle. It is
// a dispatcher call like any other (autograd records the op's node, modes, subclasses and device
// kernels run as through torch.ops). It converts the plain cases only (tensors, None, exact Python
// ints / floats / bools, a tuple or list of ints); any other call goes, unchanged, to the fallback
// it was made with (the boxed call), so what is accepted or refused, and with which message, is
// torch.ops'. Python finds it by name: apex_python_entry (end of this header), through apex._ops.
// What touches torch's Python bindings (unpacking and wrapping tensors, turning C++ errors and
// warnings into Python's) is in apex/python_entry.h, compiled once, not in this header: those
// bindings cost every unit that includes them ~5 s of code generation at -O3.

namespace detail::python {

// One argument: load(obj) takes a plain-case value (false: leave the call to the fallback), get()
// is what the op is called with. Types without a specialization get no entry.
template <class T>
struct Arg {
  static constexpr bool kSupported = false;
};

template <>
struct Arg<at::Tensor> {
  static constexpr bool kSupported = true;
  const at::Tensor* tensor = nullptr;  // the Python tensor's own, alive for the call (the caller holds it)
  bool load(PyObject* obj) {
    tensor = tensor_of(obj);
    return tensor != nullptr;
  }
  const at::Tensor& get() const { return *tensor; }
};

template <>
struct Arg<std::optional<at::Tensor>> {
  static constexpr bool kSupported = true;
  std::optional<at::Tensor> tensor;
  bool load(PyObject* obj) {
    if (obj == Py_None) return true;
    const at::Tensor* given = tensor_of(obj);
    if (given == nullptr) return false;
    tensor = *given;
    return true;
  }
  const std::optional<at::Tensor>& get() const { return tensor; }
};

// Exact ints only (not bool, not a SymInt, numpy or tensor scalar), in SymInt's range. For an exact
// int the conversion raises nothing: a value out of range only sets `overflow`.
inline bool load_int(PyObject* obj, int64_t& value) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  value = PyLong_AsLongLongAndOverflow(obj, &overflow);
  return overflow == 0 && c10::SymInt::check_range(value);
}

template <>
struct Arg<c10::SymIntArrayRef> {
  static constexpr bool kSupported = true;
  c10::SmallVector<int64_t, 8> values;
  bool load(PyObject* obj) {
    if (!PyTuple_Check(obj) && !PyList_Check(obj)) return false;  // torch.Size is a tuple
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(obj);
    PyObject** items = PySequence_Fast_ITEMS(obj);
    for (Py_ssize_t i = 0; i < size; ++i) {
      if (!load_int(items[i], values.emplace_back())) return false;
    }
    return true;
  }
  c10::SymIntArrayRef get() const { return c10::fromIntArrayRefSlow(values); }
};

template <>
struct Arg<int64_t> {
  static constexpr bool kSupported = true;
  int64_t value = 0;
  bool load(PyObject* obj) { return load_int(obj, value); }
  int64_t get() const { return value; }
};

template <>
struct Arg<double> {
  static constexpr bool kSupported = true;
  double value = 0;
  bool load(PyObject* obj) {
    if (PyFloat_CheckExact(obj)) {
      value = PyFloat_AS_DOUBLE(obj);
      return true;
    }
    int64_t integer = 0;  // torch.ops takes an int for a float too
    if (!load_int(obj, integer)) return false;
    value = static_cast<double>(integer);
    return true;
  }
  double get() const { return value; }
};

template <>
struct Arg<bool> {
  static constexpr bool kSupported = true;
  bool value = false;
  bool load(PyObject* obj) {
    value = obj == Py_True;
    return value || obj == Py_False;
  }
  bool get() const { return value; }
};

// A parameter's Arg; an op that writes through a non-const reference (Tensor(a!)) gets no entry.
template <class T>
using ArgOf = std::conditional_t<std::is_lvalue_reference_v<T> && !std::is_const_v<std::remove_reference_t<T>>,
                                 Arg<void>, Arg<std::remove_cv_t<std::remove_reference_t<T>>>>;

// Releases the GIL for the op's run, as torch's bindings and _dispatch_call_boxed do.
struct WithoutGil {
  PyThreadState* state = PyEval_SaveThread();
  WithoutGil() = default;
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;
  ~WithoutGil() { PyEval_RestoreThread(state); }
};

// The entry of Op's <op>_output (its typed handle found once), of C++ signature Tensor(Args...).
// `fallback` is the PyCFunction's self: the boxed call.
template <class Op, class Sig>
struct Entry;
template <class Op, class... Args>
struct Entry<Op, at::Tensor(Args...)> {
  static constexpr bool kSupported = (ArgOf<Args>::kSupported && ...);

  static std::string& name() {
    static std::string kName = op_name(Op::kSchema) + "_output";
    return kName;
  }

  struct Call {
    PyObject* fallback;
    PyObject* const* args;
    Py_ssize_t nargs;
  };

  // run_handled gives the whole call torch's error and warning handling (HANDLE_TH_ERRORS).
  static PyObject* call(PyObject* fallback, PyObject* const* args, Py_ssize_t nargs) {
    Call state{fallback, args, nargs};
    return run_handled(&run, &state);
  }

  static PyObject* run(void* context) {
    const Call& call = *static_cast<const Call*>(context);
    std::tuple<ArgOf<Args>...> loaded;
    if (call.nargs == sizeof...(Args) && load(loaded, call.args, std::index_sequence_for<Args...>{})) {
      static const auto handle = c10::Dispatcher::singleton()
                                     .findSchemaOrThrow(("apex::" + name()).c_str(), "")
                                     .template typed<at::Tensor(Args...)>();
      at::Tensor out;
      {
        const WithoutGil released;
        out = std::apply([](const auto&... arg) { return handle.call(arg.get()...); }, loaded);
      }
      return wrap(std::move(out));
    }
    return PyObject_Vectorcall(call.fallback, call.args, static_cast<size_t>(call.nargs), nullptr);
  }

  template <size_t... I>
  static bool load(std::tuple<ArgOf<Args>...>& loaded, PyObject* const* args, std::index_sequence<I...>) {
    return (std::get<I>(loaded).load(args[I]) && ...);
  }
};

// The entries of the op libraries loaded in this process, by qualified name ("apex::<op>_output").
// Filled while a library registers its ops (no Python call then), read by apex_python_entry. The
// deque keeps each method definition at its address for the functions made from it.
struct Registry {
  std::mutex mutex;
  std::deque<std::pair<std::string, PyMethodDef>> entries;

  static Registry& get() {
    static Registry registry;
    return registry;
  }
};

template <class Op>
void add_entry() {
  using Sig = std::remove_pointer_t<decltype(&FirstOutput<Op, Signature<Op>>::call)>;
  if constexpr (Entry<Op, Sig>::kSupported) {
    Registry& registry = Registry::get();
    const std::lock_guard<std::mutex> lock(registry.mutex);
    const std::string& name = Entry<Op, Sig>::name();
    registry.entries.emplace_back("apex::" + name,
                                  PyMethodDef{name.c_str(), reinterpret_cast<PyCFunction>(&Entry<Op, Sig>::call),
                                              METH_FASTCALL, "apex's typed entry of the op (see apex/op.h)"});
  }
}

}  // namespace detail::python

template <class Op>
void define_first_output(torch::Library& m) {
  const std::string_view schema = Op::kSchema;
  const size_t arguments = schema.find('('), returns = schema.rfind("->");
  const std::string name = detail::op_name(schema) + "_output";
  m.def((name + std::string(schema.substr(arguments, returns - arguments)) + "-> Tensor").c_str());
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd,
                                       TORCH_FN((detail::FirstOutput<Op, detail::Signature<Op>>::call))));
  detail::python::add_entry<Op>();
}

}  // namespace apex

// The typed entry of the op `qualified_name` ("apex::layer_norm_fwd_output") as a new Python function
// that hands the calls it does not convert to `fallback`; None when the op has none. Called from
// Python through ctypes (apex._ops) with the GIL held. Every op library defines it (weak: each unit
// that includes this header emits it, the linker keeps one); the registry is shared, so any library's
// copy answers for all.
extern "C" __attribute__((weak, visibility("default"))) PyObject* apex_python_entry(const char* qualified_name,
                                                                                   PyObject* fallback) {
  auto& registry = apex::detail::python::Registry::get();
  const std::lock_guard<std::mutex> lock(registry.mutex);
  for (auto& [name, method] : registry.entries) {
    if (name == qualified_name) return PyCFunction_New(&method, fallback);
  }
  Py_RETURN_NONE;
}
