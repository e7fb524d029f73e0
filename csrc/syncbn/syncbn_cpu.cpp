// syncbn CPU kernels: at::parallel_for over channels (NCHW) or over fixed row chunks (channels-last),
// with contiguous inner loops the compiler vectorizes. Row chunks do not depend on the thread count,
// so results are reproducible.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "apex/check.h"
#include "apex/acc_type.h"
#include "syncbn.h"
#include "welford.h"

namespace apex::syncbn {
namespace {

// Enough rows per channels-last chunk to amortise its per-chunk partials.
constexpr int64_t kElementsPerChunk = 1 << 16;

// Reduces each channel of an (outer, C, inner) tensor to one State.
// NCHW: one task per channel folds its `inner`-long segments with fold_segment(state, offset).
// Channels-last: fold_rows(states[C], first_row, last_row) per chunk, then chunks merge in order.
template <typename State, typename FoldSegment, typename FoldRows>
std::vector<State> reduce_channels(Layout layout, const FoldSegment& fold_segment, const FoldRows& fold_rows) {
  const int64_t channels = layout.channels;
  std::vector<State> result(channels, State::empty());
  if (!layout.channels_last()) {
    at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        for (int64_t o = 0; o < layout.outer; ++o) fold_segment(result[c], (o * channels + c) * layout.inner);
      }
    });
    return result;
  }
  const int64_t rows_per_chunk = std::max<int64_t>(1, kElementsPerChunk / channels);
  const int64_t chunks = (layout.outer + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<State> partial(chunks * channels, State::empty());
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      fold_rows(&partial[k * channels], k * rows_per_chunk, std::min(layout.outer, (k + 1) * rows_per_chunk));
    }
  });
  for (int64_t k = 0; k < chunks; ++k) {
    for (int64_t c = 0; c < channels; ++c) result[c].merge(partial[k * channels + c]);
  }
  return result;
}

// Calls body(channel, first_element_offset) for every (outer, channel) segment of `inner` elements.
template <typename Body>
void for_each_segment(Layout layout, const Body& body) {
  const int64_t grain = std::max<int64_t>(1, kElementsPerChunk / (layout.channels * layout.inner));
  at::parallel_for(0, layout.outer, grain, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      for (int64_t c = 0; c < layout.channels; ++c) body(c, (o * layout.channels + c) * layout.inner);
    }
  });
}

// A per-channel vector, or `missing` for every channel when absent.
template <typename A>
std::vector<A> to_vector(const void* p, A missing, int64_t size) {
  if (!p) return std::vector<A>(size, missing);
  const A* values = static_cast<const A*>(p);
  return std::vector<A>(values, values + size);
}

// y = (x - mean) * scale + shift [+ z], before any relu: what the forward and the relu mask share.
template <typename T, typename Body>
void for_each_normalized(const NormalizeArgs& a, const Body& body) {
  using A = acc_type<T>;
  const int64_t C = a.layout.channels;
  const auto mu = to_vector<A>(a.mean, 0, C), sigma_inv = to_vector<A>(a.inv_std, 0, C);
  const auto w = to_vector<A>(a.weight, 1, C), b = to_vector<A>(a.shift, 0, C);
  const T* x = static_cast<const T*>(a.input);
  const T* residual = static_cast<const T*>(a.z);
  for_each_segment(a.layout, [&](int64_t c, int64_t offset) {
    const A scale = sigma_inv[c] * w[c];
    for (int64_t i = offset; i < offset + a.layout.inner; ++i) {
      A v = (A(x[i]) - mu[c]) * scale + b[c];
      if (residual) v += A(residual[i]);
      body(i, v);
    }
  });
}

}  // namespace

void welford_mean_var(const Cpu&, const StatisticsArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_type<T>;
    using State = WelfordState<A>;
    const T* x = static_cast<const T*>(a.input);
    const int64_t inner = a.layout.inner, channels = a.layout.channels;
    // A segment's own mean and m2 (two passes over deviations from its first element, which stay
    // accurate when |mean| >> std), then one merge.
    auto fold_segment = [&](State& state, int64_t offset) {
      const T* seg = x + offset;
      const A pivot = A(seg[0]);
      A sum = 0;
      for (int64_t i = 0; i < inner; ++i) sum += A(seg[i]) - pivot;
      const A shifted_mean = sum / A(inner);
      A m2 = 0;
      for (int64_t i = 0; i < inner; ++i) {
        const A d = A(seg[i]) - pivot - shifted_mean;
        m2 += d * d;
      }
      state.merge({pivot + shifted_mean, m2, inner});
    };
    // Every channel of a row gains one value, so all channels share the count.
    auto fold_rows = [&](State* states, int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        const A inv_count = A(1) / A(r - first + 1);
        const T* row = x + r * channels;
        for (int64_t c = 0; c < channels; ++c) states[c].push(A(row[c]), inv_count);
      }
      for (int64_t c = 0; c < channels; ++c) states[c].count = last - first;
    };
    const auto stats = reduce_channels<State>(a.layout, fold_segment, fold_rows);
    const WriteChannelResults<A> write{static_cast<A*>(a.mean), static_cast<A*>(a.var_biased)};
    for (int64_t c = 0; c < channels; ++c) write(c, stats[c]);
  });
}

void reduce_bn(const Cpu&, const GradSumsArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_type<T>;
    using State = GradSums<A>;
    const T* x = static_cast<const T*>(a.input);
    const T* dy = static_cast<const T*>(a.grad_output);
    const A* mu = static_cast<const A*>(a.mean);
    const int64_t inner = a.layout.inner, channels = a.layout.channels;
    auto fold_segment = [&](State& state, int64_t offset) {
      const int64_t c = (offset / inner) % channels;
      A s_dy = 0, s_dy_xmu = 0;
      for (int64_t i = offset; i < offset + inner; ++i) {
        s_dy += A(dy[i]);
        s_dy_xmu += A(dy[i]) * (A(x[i]) - mu[c]);
      }
      state.merge({s_dy, s_dy_xmu});
    };
    auto fold_rows = [&](State* states, int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        for (int64_t c = 0, i = r * channels; c < channels; ++c, ++i) {
          states[c].sum_dy += A(dy[i]);
          states[c].sum_dy_xmu += A(dy[i]) * (A(x[i]) - mu[c]);
        }
      }
    };
    const auto sums = reduce_channels<State>(a.layout, fold_segment, fold_rows);
    const WriteGradSums<A> write{static_cast<A*>(a.sum_dy), static_cast<A*>(a.sum_dy_xmu),
                                 static_cast<const A*>(a.inv_std), static_cast<A*>(a.grad_weight)};
    for (int64_t c = 0; c < channels; ++c) write(c, sums[c]);
  });
}

void welford_parallel(const Cpu&, const MergeArgs& a) {
  const auto merge = [&](auto tag) {
    using A = typename decltype(tag)::type;
    const A* means = static_cast<const A*>(a.mean);
    const A* vars = static_cast<const A*>(a.var_biased);
    const auto move_toward = [&](void* running, int64_t c, A statistic) {
      if (running) static_cast<A*>(running)[c] += A(a.momentum) * (statistic - static_cast<A*>(running)[c]);
    };
    at::parallel_for(0, a.channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        auto state = WelfordState<A>::empty();
        for (int64_t r = 0; r < a.world; ++r) {
          const int64_t i = r * a.channels + c;
          const int64_t n = a.count ? a.count[r] : a.elements;
          state.merge({means[i], vars[i] * A(n), n});
        }
        const A var = state.m2 / A(state.count - 1);
        static_cast<A*>(a.out_mean)[c] = state.mean;
        static_cast<A*>(a.out_var)[c] = var;
        static_cast<A*>(a.inv_std)[c] = A(1) / std::sqrt(state.biased_var() + A(a.eps));
        move_toward(a.running_mean, c, state.mean);
        move_toward(a.running_var, c, var);
      }
    });
  };
  if (a.dtype == Dtype::kFloat64) return merge(Type<double>{});
  merge(Type<float>{});
}

void inverse_std(const Cpu&, const InverseStdArgs& a) {
  const auto compute = [&](auto tag) {
    using A = typename decltype(tag)::type;
    const A* var = static_cast<const A*>(a.var);
    A* inv_std = static_cast<A*>(a.inv_std);
    for (int64_t c = 0; c < a.channels; ++c) inv_std[c] = A(1) / std::sqrt(var[c] + A(a.eps));
  };
  if (a.dtype == Dtype::kFloat64) return compute(Type<double>{});
  compute(Type<float>{});
}

void batchnorm_forward(const Cpu&, const NormalizeArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_type<T>;
    T* y = static_cast<T*>(a.out);
    for_each_normalized<T>(a, [&](int64_t i, A v) { y[i] = T(a.fuse_relu && v < A(0) ? A(0) : v); });
  });
}

void relu_backward(const Cpu&, const NormalizeArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_type<T>;
    const T* dy = static_cast<const T*>(a.grad_output);
    T* out = static_cast<T*>(a.out);
    for_each_normalized<T>(a, [&](int64_t i, A v) { out[i] = v > A(0) ? dy[i] : T(0); });
  });
}

void batchnorm_backward(const Cpu&, const InputGradArgs& a) {
  int64_t total = a.count ? 0 : a.elements;
  for (int64_t r = 0; a.count && r < a.world; ++r) total += a.count[r];
  APEX_CHECK(total > 0, "syncbn_batchnorm_backward: count must sum to a positive number of elements, got ", total);
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_type<T>;
    const int64_t C = a.layout.channels;
    const auto mu = to_vector<A>(a.mean, 0, C), sigma_inv = to_vector<A>(a.inv_std, 0, C);
    const auto w = to_vector<A>(a.weight, 1, C);
    const auto s_dy = to_vector<A>(a.sum_dy, 0, C), s_dy_xmu = to_vector<A>(a.sum_dy_xmu, 0, C);
    const A inv_total = A(1) / A(total);
    const T* x = static_cast<const T*>(a.input);
    const T* dy = static_cast<const T*>(a.grad_output);
    T* dx = static_cast<T*>(a.grad_input);
    for_each_segment(a.layout, [&](int64_t c, int64_t offset) {
      const A mean_dy = s_dy[c] * inv_total;
      const A xmu_factor = sigma_inv[c] * sigma_inv[c] * s_dy_xmu[c] * inv_total;
      const A scale = sigma_inv[c] * w[c];
      for (int64_t i = offset; i < offset + a.layout.inner; ++i) {
        dx[i] = T((A(dy[i]) - mean_dy - (A(x[i]) - mu[c]) * xmu_factor) * scale);
      }
    });
  });
}

}  // namespace apex::syncbn
