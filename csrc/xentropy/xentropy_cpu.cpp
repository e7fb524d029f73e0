// xentropy: CPU kernels. Rows are split over torch's threads; each row is read as Acc (float, or
// double for double logits; 16-bit rows are converted into a per-thread buffer once) and reduced
// with ATen's Vectorized (AVX2 in JIT builds): max, then sum of exp(x - max) and sum of x.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "apex/acc_type.h"
#include "xentropy.h"
#include "xentropy_math.h"

namespace apex::xentropy {
namespace {

// Logits per parallel task: enough work that scheduling costs nothing next to it.
constexpr int64_t kGrainElements = 1 << 16;

int64_t grain_rows(int64_t classes) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(classes, 1)); }

// The row as Acc values: itself when it already is, else converted into `buffer`.
template <class T, class Acc = acc_type<T>>
const Acc* row_as_acc(const T* row, int64_t classes, std::vector<Acc>& buffer) {
  if constexpr (std::is_same_v<T, Acc>) {
    return row;
  } else {
    buffer.resize(classes);
    at::vec::convert(row, buffer.data(), classes);
    return buffer.data();
  }
}

// log(sum_j exp(x_j)), taken relative to the max (0 when the max is -inf, so an all -inf row
// gives -inf rather than NaN).
template <class Acc>
Acc log_sum_exp(const Acc* x, int64_t n) {
  using Vec = at::vec::Vectorized<Acc>;
  const Acc max = at::vec::reduce_all<Acc>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, x, n);
  const Acc base = max == -std::numeric_limits<Acc>::infinity() ? Acc(0) : max;
  const Acc sum_exp = at::vec::map_reduce_all<Acc>([base](Vec v) { return (v - Vec(base)).exp(); },
                                                   [](Vec a, Vec b) { return a + b; }, x, n);
  return base + std::log(sum_exp);
}

template <class Acc>
Acc sum_of(const Acc* x, int64_t n) {
  using Vec = at::vec::Vectorized<Acc>;
  return at::vec::reduce_all<Acc>([](Vec a, Vec b) { return a + b; }, x, n);
}

template <class T>
void forward_rows(const ForwardArgs& args) {
  using Acc = acc_type<T>;
  const LogitsView& view = args.logits;
  const T* logits = static_cast<const T*>(view.data);
  Acc* losses = static_cast<Acc*>(args.losses);
  Acc* lses = static_cast<Acc*>(args.max_log_sum_exp);
  at::parallel_for(0, view.rows, grain_rows(view.classes), [&](int64_t begin, int64_t end) {
    std::vector<Acc> buffer;
    for (int64_t row = begin; row < end; ++row) {
      const int64_t label = args.labels[row];
      const Label kind = classify(label, args.ignore_index, view.classes);
      if (kind == Label::kIgnored) {
        losses[row] = lses[row] = Acc(0);
        continue;
      }
      const Acc* x = row_as_acc(logits + row * view.row_stride, view.classes, buffer);
      const Acc lse = log_sum_exp(x, view.classes);
      const Acc sum = args.smoothing != 0.0 ? sum_of(x, view.classes) : Acc(0);  // row_loss ignores it unsmoothed
      lses[row] = lse;
      losses[row] = kind == Label::kValid ? row_loss(lse, x[label], sum, view.classes, args.smoothing) : quiet_nan<Acc>();
    }
  });
}

template <class T>
void backward_rows(const BackwardArgs& args) {
  using Acc = acc_type<T>;
  using Vec = at::vec::Vectorized<Acc>;
  const LogitsView& view = args.logits;
  const T* logits = static_cast<const T*>(view.data);
  const Acc* grad_loss = static_cast<const Acc*>(args.grad_loss);
  const Acc* lses = static_cast<const Acc*>(args.max_log_sum_exp);
  T* grad_logits = static_cast<T*>(args.grad_logits);
  at::parallel_for(0, view.rows, grain_rows(view.classes), [&](int64_t begin, int64_t end) {
    std::vector<Acc> input, output;
    for (int64_t row = begin; row < end; ++row) {
      const int64_t label = args.labels[row];
      const Label kind = classify(label, args.ignore_index, view.classes);
      T* out = grad_logits + row * view.classes;
      if (kind == Label::kIgnored) {
        std::fill(out, out + view.classes, T(0));
        continue;
      }
      const Acc g = kind == Label::kValid ? grad_loss[row * args.grad_stride] : quiet_nan<Acc>();
      const GradTerms<Acc> terms = grad_terms(g, view.classes, args.smoothing);
      const Acc lse = lses[row];
      const Acc* x = row_as_acc(logits + row * view.row_stride, view.classes, input);
      // Straight into `out` when it holds Acc; else through a buffer converted once.
      Acc* result = std::is_same_v<T, Acc> ? reinterpret_cast<Acc*>(out) : (output.resize(view.classes), output.data());
      at::vec::map([&](Vec v) { return Vec(g) * (v - Vec(lse)).exp() - Vec(terms.uniform); }, result, x, view.classes);
      if (kind == Label::kValid) result[label] -= terms.target;
      if constexpr (!std::is_same_v<T, Acc>) at::vec::convert(result, out, view.classes);
    }
  });
}

}  // namespace

void forward(const Cpu&, const ForwardArgs& args) {
  dispatch_floating(args.logits.dtype, [&](auto tag) { forward_rows<typename decltype(tag)::type>(args); });
}

void backward(const Cpu&, const BackwardArgs& args) {
  dispatch_floating(args.logits.dtype, [&](auto tag) { backward_rows<typename decltype(tag)::type>(args); });
}

}  // namespace apex::xentropy
