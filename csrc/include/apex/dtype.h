#pragma once
// The element types of kernel data, and the one dtype dispatch every op uses.
//
// Kernel argument structs carry an apex::Dtype (not an at::ScalarType) so kernel sources need no
// torch headers; op.h maps tensors to it, with a clear error for unsupported dtypes, before any
// launch. Inside a kernel source:
//
//   dispatch_floating(args.dtype, [&](auto tag) {
//     using T = typename decltype(tag)::type;     // float, c10::Half, c10::BFloat16 or double
//     my_kernel<T><<<...>>>(static_cast<const T*>(args.x), ...);
//   });

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace apex {

enum class Dtype : int8_t { kFloat32, kFloat16, kBFloat16, kFloat64 };

inline const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat32: return "float32";
    case Dtype::kFloat16: return "float16";
    case Dtype::kBFloat16: return "bfloat16";
    case Dtype::kFloat64: return "float64";
  }
  return "?";
}

template <class T>
struct Type {
  using type = T;
};

template <class T>
constexpr Dtype dtype_of();
template <> constexpr Dtype dtype_of<float>() { return Dtype::kFloat32; }
template <> constexpr Dtype dtype_of<c10::Half>() { return Dtype::kFloat16; }
template <> constexpr Dtype dtype_of<c10::BFloat16>() { return Dtype::kBFloat16; }
template <> constexpr Dtype dtype_of<double>() { return Dtype::kFloat64; }

// Calls f(Type<T>{}) for the C++ type T of `dtype`. The op's host code has already refused
// dtypes the op does not support (apex::floating_dtype in op.h), so kWithDouble = false only
// removes the float64 instantiations from a kernel that never sees float64.
template <bool kWithDouble = true, class F>
decltype(auto) dispatch_floating(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kFloat32: return f(Type<float>{});
    case Dtype::kFloat16: return f(Type<c10::Half>{});
    case Dtype::kBFloat16: return f(Type<c10::BFloat16>{});
    case Dtype::kFloat64:
      if constexpr (kWithDouble) return f(Type<double>{});
      break;
  }
  throw std::invalid_argument(std::string("apex: no kernel for dtype ") + dtype_name(dtype));
}

}  // namespace apex
