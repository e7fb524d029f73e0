#pragma once
// APEX_CHECK(cond, parts...): TORCH_CHECK whose message is assembled as one std::string, and whose
// condition may be a plain bool or a symbolic one (c10::SymBool, from the shape function running
// under torch.compile with dynamic shapes).
//
// Why not TORCH_CHECK(cond, "got ", n) directly: TORCH_CHECK formats its parts with an inlined
// std::ostringstream, and on an image whose extension compiler ships a newer libstdc++ than the
// one torch runs with (seen: torch 2.11 beside /opt/gcc 13), `ostream << long` inside the
// extension segfaults instead of raising. Every op formats through apex::message(), which only
// appends strings (integers via std::to_string, shapes and dtypes via the functions below), so
// TORCH_CHECK receives a single std::string and never touches an ostream in extension code.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/SymBool.h>
#include <c10/core/SymInt.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

namespace apex {

inline std::string to_text(std::string_view s) { return std::string(s); }
inline std::string to_text(const std::string& s) { return s; }
inline std::string to_text(const char* s) { return s; }
inline std::string to_text(char c) { return std::string(1, c); }
inline std::string to_text(bool b) { return b ? "true" : "false"; }
inline std::string to_text(c10::ScalarType t) { return c10::toString(t); }
inline std::string to_text(const c10::Device& d) { return d.str(); }

template <typename Int, std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool> &&
                                             !std::is_same_v<Int, char>, int> = 0>
std::string to_text(Int value) {
  return std::to_string(value);
}

template <typename Float, std::enable_if_t<std::is_floating_point_v<Float>, int> = 0>
std::string to_text(Float value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", static_cast<double>(value));
  return buffer;
}

// A size that may be symbolic (torch.compile with dynamic shapes): its value, or its expression.
inline std::string to_text(const c10::SymInt& value) {
  if (auto known = value.maybe_as_int()) return std::to_string(*known);
  return value.toSymNodeImplUnowned()->str();
}

// A shape as torch prints it: [2, 3, 4].
inline std::string to_text(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

inline std::string to_text(c10::SymIntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + to_text(sizes[i]);
  return out + "]";
}

template <typename... Parts>
std::string message(const Parts&... parts) {
  std::string out;
  ((out += to_text(parts)), ...);
  return out;
}

// A check's condition: plain, or symbolic (then it becomes a guard of the compiled graph).
inline bool holds(bool condition) { return condition; }
inline bool holds(const c10::SymBool& condition) { return condition.guard_bool(__FILE__, __LINE__); }

}  // namespace apex

#define APEX_CHECK(cond, ...) TORCH_CHECK(::apex::holds(cond), ::apex::message(__VA_ARGS__))
