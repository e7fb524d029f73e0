// fused_bias_swiglu: CPU kernels. Rows are split over torch's threads; within a row, blocks of the
// gate and up halves are converted to the accumulation type (float, double for float64), combined
// with ATen's Vectorized math (AVX2 in JIT builds) and converted back.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "fused_swiglu.h"
#include "swiglu_math.h"

namespace apex::fused_swiglu {
namespace {

// Columns converted per step: the block's buffers stay in L1.
constexpr int64_t kBlock = 512;
// Rows per parallel task (a row is at least a few hundred elements in practice).
constexpr int64_t kRowGrain = 16;

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// The bias as Acc (zeros without one), converted once per call.
template <class T>
std::vector<acc_t<T>> bias_as_acc(const void* bias, int64_t width) {
  std::vector<acc_t<T>> out(width, acc_t<T>(0));
  if (bias != nullptr) at::vec::convert(static_cast<const T*>(bias), out.data(), width);
  return out;
}

// a = gate + b1 and b = up + b2 of columns [j0, j0 + n) of the row x, as Acc.
template <class T>
void biased_halves(const T* x, const std::vector<acc_t<T>>& bias, int64_t half, int64_t j0, int64_t n, acc_t<T>* a,
                   acc_t<T>* b) {
  using V = at::vec::Vectorized<acc_t<T>>;
  const auto add = [](V u, V w) { return u + w; };
  at::vec::convert(x + j0, a, n);
  at::vec::convert(x + half + j0, b, n);
  at::vec::map2(add, a, a, bias.data() + j0, n);
  at::vec::map2(add, b, b, bias.data() + half + j0, n);
}

template <class T>
void forward_rows(const ForwardArgs& args) {
  using Acc = acc_t<T>;
  using V = at::vec::Vectorized<Acc>;
  const int64_t half = args.half;
  const std::vector<Acc> bias = bias_as_acc<T>(args.bias, 2 * half);
  at::parallel_for(0, args.rows, kRowGrain, [&](int64_t begin, int64_t end) {
    Acc a[kBlock], b[kBlock];
    for (int64_t r = begin; r < end; ++r) {
      const T* x = static_cast<const T*>(args.x) + r * 2 * half;
      T* y = static_cast<T*>(args.y) + r * half;
      for (int64_t j0 = 0; j0 < half; j0 += kBlock) {
        const int64_t n = std::min(kBlock, half - j0);
        biased_halves<T>(x, bias, half, j0, n, a, b);
        at::vec::map2([](V u, V w) { return swiglu(u, w); }, a, a, b, n);
        at::vec::convert(a, y + j0, n);
      }
    }
  });
}

// grad_x for rows [begin, end); adds each grad_x column into bias_sums when given.
template <class T>
void backward_rows(const BackwardArgs& args, const std::vector<acc_t<T>>& bias, int64_t begin, int64_t end,
                   acc_t<T>* bias_sums) {
  using Acc = acc_t<T>;
  using V = at::vec::Vectorized<Acc>;
  const int64_t half = args.half;
  Acc g[kBlock], a[kBlock], b[kBlock];
  for (int64_t r = begin; r < end; ++r) {
    const T* x = static_cast<const T*>(args.x) + r * 2 * half;
    const T* grad = static_cast<const T*>(args.grad_y) + r * half;
    T* dx = static_cast<T*>(args.grad_x) + r * 2 * half;
    for (int64_t j0 = 0; j0 < half; j0 += kBlock) {
      const int64_t n = std::min(kBlock, half - j0);
      at::vec::convert(grad + j0, g, n);
      biased_halves<T>(x, bias, half, j0, n, a, b);
      for (int64_t j = 0; j < n; j += V::size()) {  // a and b become d_gate and d_up in place
        const int count = static_cast<int>(std::min<int64_t>(V::size(), n - j));
        const SwigluGrad<V> d = swiglu_grad(V::loadu(g + j, count), V::loadu(a + j, count), V::loadu(b + j, count));
        d.gate.store(a + j, count);
        d.up.store(b + j, count);
      }
      at::vec::convert(a, dx + j0, n);
      at::vec::convert(b, dx + half + j0, n);
      if (bias_sums != nullptr) {  // the unrounded values, as the CUDA kernel sums them
        for (int64_t k = 0; k < n; ++k) {
          bias_sums[j0 + k] += a[k];
          bias_sums[half + j0 + k] += b[k];
        }
      }
    }
  }
}

// One task per chunk of rows, so that each owns one row of partial bias sums.
int64_t bias_grad_chunks(int64_t rows) { return std::max<int64_t>(1, std::min<int64_t>(rows, at::get_num_threads())); }

template <class T>
void backward_all(const BackwardArgs& args) {
  using Acc = acc_t<T>;
  const int64_t width = 2 * args.half;
  const std::vector<Acc> bias = bias_as_acc<T>(args.bias, width);
  if (args.grad_bias == nullptr) {
    at::parallel_for(0, args.rows, kRowGrain,
                     [&](int64_t begin, int64_t end) { backward_rows<T>(args, bias, begin, end, nullptr); });
    return;
  }
  const int64_t chunks = bias_grad_chunks(args.rows), per_chunk = (args.rows + chunks - 1) / chunks;
  std::vector<std::vector<Acc>> partials(chunks, std::vector<Acc>(width, Acc(0)));
  at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      backward_rows<T>(args, bias, std::min(args.rows, c * per_chunk), std::min(args.rows, (c + 1) * per_chunk),
                       partials[c].data());
    }
  });
  T* grad_bias = static_cast<T*>(args.grad_bias);
  for (int64_t j = 0; j < width; ++j) {
    Acc total = Acc(0);
    for (int64_t c = 0; c < chunks; ++c) total += partials[c][j];
    grad_bias[j] = static_cast<T>(total);
  }
}

}  // namespace

void forward(const Cpu&, const ForwardArgs& args) {
  if (args.rows == 0 || args.half == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) { forward_rows<typename decltype(tag)::type>(args); });
}

void backward(const Cpu&, const BackwardArgs& args) {
  if (args.grad_bias != nullptr && (args.rows == 0 || args.half == 0)) {
    dispatch_floating(args.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      std::fill_n(static_cast<T*>(args.grad_bias), 2 * args.half, T(0));
    });
  }
  if (args.rows == 0 || args.half == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) { backward_all<typename decltype(tag)::type>(args); });
}

// The CPU kernel keeps its partial sums itself.
int64_t bias_grad_workspace_bytes(const Cpu&, int64_t, int64_t, Dtype) { return 0; }

}  // namespace apex::fused_swiglu
