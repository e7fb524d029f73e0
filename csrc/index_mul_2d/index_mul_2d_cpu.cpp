// index_mul_2d: CPU kernels. Row-wise outputs: rows split over torch's threads, each row's
// features converted to Acc once and multiplied with ATen's Vectorized. The scatter into grad_in1:
// features split over threads, rows in order, so no two threads add into one value (no races, and
// the same sums every run), in Acc (a scratch accumulator for 16-bit data) rounded once.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "apex/acc_type.h"
#include "index_mul_2d.h"

namespace apex::index_mul_2d {
namespace {

// Elements per parallel task: enough work that scheduling costs nothing next to it.
constexpr int64_t kGrainElements = 1 << 15;

// The source row of `row`, or -1 when its index is out of range.
int64_t source_of(const Args& args, int64_t row) {
  int64_t source = args.index[row];
  if (source < 0) source += args.sources;
  return source >= 0 && source < args.sources ? source : -1;
}

// One row of features as Acc values: the row itself when it already is Acc, else a converted copy
// in `buffer`; zeros for a null tensor.
template <class T, class Acc = acc_type<T>>
const Acc* as_acc(const T* row, int64_t n, std::vector<Acc>& buffer) {
  if (row == nullptr) {
    buffer.assign(n, Acc(0));
    return buffer.data();
  }
  if constexpr (std::is_same_v<T, Acc>) {
    return row;
  } else {
    buffer.resize(n);
    at::vec::convert(row, buffer.data(), n);
    return buffer.data();
  }
}

template <class T, class Acc>
void store_row(const Acc* values, int64_t n, T* out) {
  if constexpr (std::is_same_v<T, Acc>) {
    std::copy(values, values + n, out);
  } else {
    at::vec::convert(values, out, n);
  }
}

template <class T>
const T* row_of(const void* base, int64_t row, int64_t features) {
  return base == nullptr ? nullptr : static_cast<const T*>(base) + row * features;
}

template <class T>
void row_outputs(Pass pass, const Args& args) {
  using Acc = acc_type<T>;
  using Vec = at::vec::Vectorized<Acc>;
  const int64_t n = args.features;
  const auto mul = [](Vec a, Vec b) { return a * b; };
  at::parallel_for(0, args.rows, std::max<int64_t>(1, kGrainElements / n), [&](int64_t begin, int64_t end) {
    std::vector<Acc> a, b, c, d, result;
    result.resize(n);
    for (int64_t row = begin; row < end; ++row) {
      T* out = static_cast<T*>(args.out) + row * n;
      T* out2 = pass == Pass::kDoubleBackward ? static_cast<T*>(args.out2) + row * n : nullptr;
      const int64_t source = source_of(args, row);
      if (source < 0) {
        std::fill(out, out + n, static_cast<T>(std::numeric_limits<Acc>::quiet_NaN()));
        if (out2 != nullptr) std::fill(out2, out2 + n, static_cast<T>(std::numeric_limits<Acc>::quiet_NaN()));
        continue;
      }
      const Acc* in1 = as_acc(row_of<T>(args.in1, source, n), n, a);
      if (pass == Pass::kForward) {
        at::vec::map2(mul, result.data(), in1, as_acc(row_of<T>(args.in2, row, n), n, b), n);
      } else if (pass == Pass::kBackward) {
        at::vec::map2(mul, result.data(), as_acc(row_of<T>(args.grad_out, row, n), n, b), in1, n);
      } else {
        const Acc* gg1 = as_acc(row_of<T>(args.grad_grad_in1, source, n), n, b);
        const Acc* gg2 = as_acc(row_of<T>(args.grad_grad_in2, row, n), n, c);
        const Acc* in2 = as_acc(row_of<T>(args.in2, row, n), n, d);
        at::vec::map4([](Vec g1, Vec x2, Vec x1, Vec g2) { return g1 * x2 + x1 * g2; }, result.data(), gg1, in2, in1,
                      gg2, n);
        store_row(result.data(), n, out);
        at::vec::map2(mul, result.data(), gg1, as_acc(row_of<T>(args.grad_out, row, n), n, d), n);
        out = out2;
      }
      store_row(result.data(), n, out);
    }
  });
}

// grad_in1[source(r)] += x[r] * y[r] over every row r with a valid index, into `sums` (zeroed).
template <class T, class Acc = acc_type<T>>
void scatter_products(const Args& args, const void* x_base, const void* y_base, Acc* sums) {
  const int64_t n = args.features;
  const T* x = static_cast<const T*>(x_base);
  const T* y = static_cast<const T*>(y_base);
  at::parallel_for(0, n, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(args.rows, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t row = 0; row < args.rows; ++row) {
                       const int64_t source = source_of(args, row);
                       if (source < 0) continue;
                       Acc* into = sums + source * n;
                       const T* xr = x + row * n;
                       const T* yr = y + row * n;
                       for (int64_t f = begin; f < end; ++f) {
                         into[f] += static_cast<Acc>(xr[f]) * static_cast<Acc>(yr[f]);
                       }
                     }
                   });
}

// grad_in1 (zeroed) = the scattered products, summed in Acc: in place when T is Acc, else in a
// zeroed scratch accumulator rounded into grad_in1 once.
template <class T>
void scatter_into_grad_in1(const Args& args, const void* x, const void* y, const Scratch& scratch) {
  using Acc = acc_type<T>;
  T* grad_in1 = static_cast<T*>(args.grad_in1);
  if constexpr (std::is_same_v<T, Acc>) {
    scatter_products<T>(args, x, y, grad_in1);
  } else {
    const int64_t count = args.sources * args.features;
    Acc* sums = static_cast<Acc*>(scratch(static_cast<size_t>(count) * sizeof(Acc)));
    std::fill(sums, sums + count, Acc(0));
    scatter_products<T>(args, x, y, sums);
    at::parallel_for(0, count, kGrainElements, [&](int64_t begin, int64_t end) {
      at::vec::convert(sums + begin, grad_in1 + begin, end - begin);
    });
  }
}

}  // namespace

void index_mul(const Cpu&, Pass pass, const Args& args, const Scratch& scratch) {
  if (args.rows == 0 || args.features == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    row_outputs<T>(pass, args);
    if (pass == Pass::kBackward) scatter_into_grad_in1<T>(args, args.grad_out, args.in2, scratch);
    if (pass == Pass::kDoubleBackward && args.grad_grad_in2 != nullptr) {
      scatter_into_grad_in1<T>(args, args.grad_grad_in2, args.grad_out, scratch);
    }
  });
}

}  // namespace apex::index_mul_2d
