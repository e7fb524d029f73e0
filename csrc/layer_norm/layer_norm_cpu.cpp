// fused_layer_norm_cuda: CPU kernels. Rows in parallel (at::parallel_for), each row converted once
// to the accumulation type and processed with ATen's Vectorized (AVX2 in JIT builds).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "layer_norm.h"
#include "layer_norm_math.h"

namespace apex::layer_norm {
namespace {

// Rows per parallel task: enough elements that scheduling is cheap against the work.
constexpr int64_t kElementsPerTask = 1 << 15;

int64_t grain_rows(int64_t cols) { return std::max<int64_t>(1, kElementsPerTask / cols); }

// weight / bias as accumulation-type vectors (`fill` when absent), so every row loop has one shape.
template <typename W, typename A>
std::vector<A> parameter_or(const void* p, int64_t cols, A fill) {
  std::vector<A> out(cols, fill);
  if (p) at::vec::convert(static_cast<const W*>(p), out.data(), cols);
  return out;
}

// The row loop both directions share: rows split into parallel tasks, each task calling
// body(begin, end, gamma, beta) with weight / bias in the accumulation type A (1 / 0 when absent).
template <typename W, typename A, typename Body>
void for_row_ranges(int64_t rows, int64_t cols, const void* weight, const void* bias, Body&& body) {
  const auto gamma = parameter_or<W>(weight, cols, A(1));
  const auto beta = parameter_or<W>(bias, cols, A(0));
  at::parallel_for(0, rows, grain_rows(cols),
                   [&](int64_t begin, int64_t end) { body(begin, end, gamma.data(), beta.data()); });
}

template <typename T, typename W>
void forward_rows(const ForwardArgs& a) {
  using A = Acc<T>;
  using Vec = at::vec::Vectorized<A>;
  const int64_t cols = a.cols;
  const T* x = static_cast<const T*>(a.input);
  W* y = static_cast<W*>(a.output);
  A* mean_out = static_cast<A*>(a.mean);
  A* invvar_out = static_cast<A*>(a.invvar);
  const auto plus = [](Vec u, Vec v) { return u + v; };

  const auto normalize_rows = [&](int64_t begin, int64_t end, const A* gamma, const A* beta) {
    std::vector<A> row(cols);
    for (int64_t r = begin; r < end; ++r) {
      at::vec::convert(x + r * cols, row.data(), cols);
      const A mean = a.rms ? A(0) : at::vec::reduce_all<A>(plus, row.data(), cols) / cols;
      const A var = at::vec::map_reduce_all<A>(
                        [mean](Vec v) {
                          const Vec d = v - Vec(mean);
                          return d * d;
                        },
                        plus, row.data(), cols) /
                    cols;
      const A invvar = A(1) / std::sqrt(var + static_cast<A>(a.eps));
      at::vec::map3<A>([mean, invvar](Vec v, Vec g, Vec b) { return (v - Vec(mean)) * Vec(invvar) * g + b; },
                       row.data(), row.data(), gamma, beta, cols);
      at::vec::convert(row.data(), y + r * cols, cols);
      if (mean_out) mean_out[r] = mean;
      invvar_out[r] = invvar;
    }
  };
  for_row_ranges<W, A>(a.rows, cols, a.weight, a.bias, normalize_rows);
}

template <typename T, typename W>
void backward_rows(const BackwardArgs& a) {
  using A = Acc<T>;
  using Vec = at::vec::Vectorized<A>;
  const bool want_dgamma = a.grad_weight != nullptr, want_dbeta = a.grad_bias != nullptr;
  const int64_t cols = a.cols;
  const T* x_or_y = static_cast<const T*>(a.input_or_output);
  const W* dy = static_cast<const W*>(a.grad_output);
  T* dx = static_cast<T*>(a.grad_input);
  const A* mean = a.rms || a.memory_efficient ? nullptr : static_cast<const A*>(a.mean);
  const A* invvar = static_cast<const A*>(a.invvar);
  const auto plus = [](Vec u, Vec v) { return u + v; };

  // One row of weight/bias partial sums per worker thread, summed at the end (no sharing, no atomics).
  const int64_t workers = at::get_num_threads();
  std::vector<A> dgamma_parts(want_dgamma ? workers * cols : 0, A(0));
  std::vector<A> dbeta_parts(want_dbeta ? workers * cols : 0, A(0));

  const auto differentiate_rows = [&](int64_t begin, int64_t end, const A* gamma, const A* beta) {
    std::vector<A> xhat(cols), dy_row(cols), gdy(cols);
    A* dgamma = want_dgamma ? dgamma_parts.data() + at::get_thread_num() * cols : nullptr;
    A* dbeta = want_dbeta ? dbeta_parts.data() + at::get_thread_num() * cols : nullptr;
    for (int64_t r = begin; r < end; ++r) {
      at::vec::convert(x_or_y + r * cols, xhat.data(), cols);
      at::vec::convert(dy + r * cols, dy_row.data(), cols);
      const NormalizedInput<A> normalize{mean ? mean[r] : A(0), invvar[r], static_cast<A>(a.eps),
                                         a.memory_efficient, a.weight != nullptr, a.bias != nullptr};
      for (int64_t c = 0; c < cols; ++c) xhat[c] = normalize(xhat[c], gamma[c], beta[c]);
      at::vec::map2<A>([](Vec g, Vec d) { return g * d; }, gdy.data(), gamma, dy_row.data(), cols);
      const A mean_gdy = a.rms ? A(0) : at::vec::reduce_all<A>(plus, gdy.data(), cols) / cols;
      const A mean_gdy_xhat =
          at::vec::map2_reduce_all<A>([](Vec g, Vec h) { return g * h; }, plus, gdy.data(), xhat.data(), cols) /
          cols;
      const A inv = invvar[r];
      at::vec::map2<A>(  // mean_gdy is 0 for RMSNorm: LayerNorm's formula serves both
          [=](Vec g, Vec h) { return grad_input<false>(Vec(inv), g, h, Vec(mean_gdy), Vec(mean_gdy_xhat)); },
          gdy.data(), gdy.data(), xhat.data(), cols);
      at::vec::convert(gdy.data(), dx + r * cols, cols);
      if (dgamma) {
        for (int64_t c = 0; c < cols; ++c) dgamma[c] += dy_row[c] * xhat[c];
      }
      if (dbeta) {
        for (int64_t c = 0; c < cols; ++c) dbeta[c] += dy_row[c];
      }
    }
  };
  for_row_ranges<W, A>(a.rows, cols, a.weight, a.bias, differentiate_rows);

  const auto reduce_parts = [&](const std::vector<A>& parts, void* out) {
    std::vector<A> total(cols, A(0));
    for (int64_t w = 0; w < workers; ++w) {
      at::vec::map2<A>(plus, total.data(), total.data(), parts.data() + w * cols, cols);
    }
    at::vec::convert(total.data(), static_cast<W*>(out), cols);
  };
  if (want_dgamma) reduce_parts(dgamma_parts, a.grad_weight);
  if (want_dbeta) reduce_parts(dbeta_parts, a.grad_bias);
}

}  // namespace

void forward(const Cpu&, const ForwardArgs& args) {
  dispatch_input_and_output(args.input_dtype, args.output_dtype, [&](auto t, auto w) {
    forward_rows<typename decltype(t)::type, typename decltype(w)::type>(args);
  });
}

void backward(const Cpu&, const BackwardArgs& args) {
  dispatch_input_and_output(args.input_dtype, args.output_dtype, [&](auto t, auto w) {
    backward_rows<typename decltype(t)::type, typename decltype(w)::type>(args);
  });
}

}  // namespace apex::layer_norm
