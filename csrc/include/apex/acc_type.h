#pragma once
// The type kernels accumulate T data in (sums, means, variances, norms, softmax denominators):
// float for float32 and the 16-bit types, double for double. Host and device code alike. Its
// tensor-side twin is apex::statistics_dtype (op.h), which picks the dtype of the tensors such
// accumulations are stored in.
#include <type_traits>

namespace apex {

template <class T>
using acc_type = std::conditional_t<std::is_same_v<T, double>, double, float>;

}  // namespace apex
