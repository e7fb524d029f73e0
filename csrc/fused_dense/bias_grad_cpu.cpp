// fused_dense: the activation-and-bias gradient pass (bias_grad.h) on torch's CPU threads. The same
// scheme as the CUDA kernel: fixed tiles of rows, each tile's column sums in row order into a
// workspace row, then the tiles folded in order, so the result does not depend on the thread count.
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>

#include "bias_grad.h"
#include "dense_math.h"

namespace apex::fused_dense {
namespace {

// Rows summed into one workspace row: the workspace is 1/128 of the data, and a tile is long enough
// that the hardware prefetcher runs along each of its row segments.
constexpr int64_t kTileRows = 128;
// Columns of one task: its workspace segment (4 KiB of float) stays in L1 while the tile's rows stream past.
constexpr int64_t kColumnBlock = 1024;
// Elements per parallel task at least: big enough that scheduling costs nothing next to the work
// (dense_cpu.cpp's grain). Names here are unique within the op: its .cpp files may share a unity unit.
constexpr int64_t kMinTaskElements = 32768;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Calls f(std::integral_constant<Activation, a>{}): the activation a compile-time constant, so that the
// derivative's switch folds away and the column loops vectorize where the math allows.
template <class F>
void dispatch_activation(Activation activation, F&& f) {
  switch (activation) {
    case Activation::kNone: return f(std::integral_constant<Activation, Activation::kNone>{});
    case Activation::kRelu: return f(std::integral_constant<Activation, Activation::kRelu>{});
    case Activation::kSigmoid: return f(std::integral_constant<Activation, Activation::kSigmoid>{});
    case Activation::kGelu: return f(std::integral_constant<Activation, Activation::kGelu>{});
    case Activation::kGeluTanh: return f(std::integral_constant<Activation, Activation::kGeluTanh>{});
  }
}

// grad * activation'(saved[i]) rounded to T; saved is not read for kNone (the gradient passes through).
template <Activation kAct, class T>
inline T pre_activation_grad(T grad, const T* saved, int64_t i) {
  using A = acc_t<T>;
  if constexpr (kAct == Activation::kNone) {
    return grad;
  } else {
    return static_cast<T>(static_cast<A>(grad) * activation_derivative(static_cast<A>(saved[i]), kAct));
  }
}

// partials[tile, first_col:end_col] = the tile's rows of those columns summed in row order, writing
// their grad_input on the way (kWrite).
template <class T, Activation kAct, bool kWrite>
void sum_tile(const ActivationBiasGradArgs& args, int64_t tile, int64_t first_col, int64_t end_col,
              acc_t<T>* partials) {
  using A = acc_t<T>;
  const int64_t cols = args.cols, end_row = std::min(args.rows, (tile + 1) * kTileRows);
  A* sums = partials + tile * cols;
  std::fill(sums + first_col, sums + end_col, A(0));
  for (int64_t r = tile * kTileRows; r < end_row; ++r) {
    const T* grad = static_cast<const T*>(args.grad) + r * cols;
    const T* saved = kAct == Activation::kNone ? nullptr : static_cast<const T*>(args.saved) + r * cols;
    T* grad_input = kWrite ? static_cast<T*>(args.grad_input) + r * cols : nullptr;
    for (int64_t c = first_col; c < end_col; ++c) {
      const T value = pre_activation_grad<kAct>(grad[c], saved, c);
      if constexpr (kWrite) grad_input[c] = value;
      sums[c] += static_cast<A>(value);
    }
  }
}

template <class T, Activation kAct, bool kWrite>
void sum_tiles_and_fold(const ActivationBiasGradArgs& args, acc_t<T>* partials) {
  using A = acc_t<T>;
  const int64_t rows = args.rows, cols = args.cols;
  const int64_t tiles = ceil_div(rows, kTileRows), column_blocks = ceil_div(cols, kColumnBlock);
  const int64_t task_elements = std::min(rows, kTileRows) * std::min(cols, kColumnBlock);
  // Tasks (tile, column block), each summing its own workspace segment: no two tasks share one.
  at::parallel_for(0, tiles * column_blocks, std::max<int64_t>(1, kMinTaskElements / task_elements),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t task = begin; task < end; ++task) {
                       const int64_t first_col = task % column_blocks * kColumnBlock;
                       sum_tile<T, kAct, kWrite>(args, task / column_blocks, first_col,
                                                 std::min(cols, first_col + kColumnBlock), partials);
                     }
                   });
  // The tiles folded in order into the first workspace row, then rounded to T.
  T* grad_bias = static_cast<T*>(args.grad_bias);
  at::parallel_for(0, cols, std::max<int64_t>(1, kMinTaskElements / tiles), [&](int64_t begin, int64_t end) {
    for (int64_t tile = 1; tile < tiles; ++tile) {
      const A* part = partials + tile * cols;
      for (int64_t c = begin; c < end; ++c) partials[c] += part[c];
    }
    for (int64_t c = begin; c < end; ++c) grad_bias[c] = static_cast<T>(partials[c]);
  });
}

}  // namespace

void activation_bias_grad(const Cpu&, const ActivationBiasGradArgs& args, const Scratch& scratch) {
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* grad_bias = static_cast<T*>(args.grad_bias);
    if (args.rows == 0) {
      std::fill(grad_bias, grad_bias + args.cols, T(0));  // a sum over no rows
      return;
    }
    if (args.cols == 0) return;
    A* partials = static_cast<A*>(scratch(sizeof(A) * static_cast<size_t>(ceil_div(args.rows, kTileRows)) *
                                          static_cast<size_t>(args.cols)));
    dispatch_activation(args.activation, [&](auto activation) {
      constexpr Activation kAct = decltype(activation)::value;
      if (args.grad_input != nullptr) {
        sum_tiles_and_fold<T, kAct, true>(args, partials);
      } else {
        sum_tiles_and_fold<T, kAct, false>(args, partials);
      }
    });
  });
}

}  // namespace apex::fused_dense
