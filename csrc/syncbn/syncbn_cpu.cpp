// syncbn CPU kernels: at::parallel_for over channels (NCHW) or over fixed row
// chunks (channels-last), with contiguous inner loops the compiler vectorizes.
// Row chunks do not depend on the thread count, so results are reproducible.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "syncbn_ops.h"
#include "welford.h"

namespace apex_syncbn {
namespace {

// Enough rows per channels-last chunk to amortise its per-chunk partials.
constexpr int64_t kElementsPerChunk = 1 << 16;

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

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

template <typename acc_t>
std::vector<acc_t> to_vector(const Tensor& t, acc_t missing, int64_t size) {
  if (!t.defined()) return std::vector<acc_t>(size, missing);
  const acc_t* p = t.const_data_ptr<acc_t>();
  return std::vector<acc_t>(p, p + size);
}

}  // namespace

void CpuKernels::welford_mean_var(const Tensor& input, Layout layout, Tensor& mean, Tensor& var_biased) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "syncbn_welford_mean_var_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using State = WelfordState<acc_t>;
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const int64_t inner = layout.inner, channels = layout.channels;
    // A segment's own mean and m2 (two passes over deviations from its first element,
    // which stay accurate when |mean| >> std), then one merge.
    auto fold_segment = [&](State& state, int64_t offset) {
      const scalar_t* seg = x + offset;
      const acc_t pivot = acc_t(seg[0]);
      acc_t sum = 0;
      for (int64_t i = 0; i < inner; ++i) sum += acc_t(seg[i]) - pivot;
      const acc_t shifted_mean = sum / acc_t(inner);
      acc_t m2 = 0;
      for (int64_t i = 0; i < inner; ++i) {
        const acc_t d = acc_t(seg[i]) - pivot - shifted_mean;
        m2 += d * d;
      }
      state.merge({pivot + shifted_mean, m2, inner});
    };
    // Every channel of a row gains one value, so all channels share the count.
    auto fold_rows = [&](State* states, int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        const acc_t inv_count = acc_t(1) / acc_t(r - first + 1);
        const scalar_t* row = x + r * channels;
        for (int64_t c = 0; c < channels; ++c) states[c].push(acc_t(row[c]), inv_count);
      }
      for (int64_t c = 0; c < channels; ++c) states[c].count = last - first;
    };
    const auto stats = reduce_channels<State>(layout, fold_segment, fold_rows);
    const WriteChannelResults<acc_t> write{mean.mutable_data_ptr<acc_t>(), var_biased.mutable_data_ptr<acc_t>()};
    for (int64_t c = 0; c < channels; ++c) write(c, stats[c]);
  });
}

void CpuKernels::welford_parallel(const Tensor& mean, const Tensor& var_biased, const Tensor& count, double eps,
                                  Tensor& out_mean, Tensor& out_var, Tensor& inv_std) {
  AT_DISPATCH_FLOATING_TYPES(mean.scalar_type(), "syncbn_welford_parallel_cpu", [&] {
    const int64_t world = mean.size(0), channels = mean.size(1);
    const scalar_t* means = mean.const_data_ptr<scalar_t>();
    const scalar_t* vars = var_biased.const_data_ptr<scalar_t>();
    const int64_t* counts = count.const_data_ptr<int64_t>();
    at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        auto state = WelfordState<scalar_t>::empty();
        for (int64_t r = 0; r < world; ++r) {
          const int64_t i = r * channels + c;
          state.merge({means[i], vars[i] * scalar_t(counts[r]), counts[r]});
        }
        out_mean.mutable_data_ptr<scalar_t>()[c] = state.mean;
        out_var.mutable_data_ptr<scalar_t>()[c] = state.m2 / scalar_t(state.count - 1);
        inv_std.mutable_data_ptr<scalar_t>()[c] = scalar_t(1) / std::sqrt(state.biased_var() + scalar_t(eps));
      }
    });
  });
}

void CpuKernels::batchnorm_forward(const Tensor& input, const NormalizeArgs& args, bool fuse_relu, Layout layout,
                                   Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "syncbn_batchnorm_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const int64_t C = layout.channels;
    const auto mu = to_vector<acc_t>(args.mean, 0, C), sigma_inv = to_vector<acc_t>(args.inv_std, 0, C);
    const auto w = to_vector<acc_t>(args.weight, 1, C), b = to_vector<acc_t>(args.shift, 0, C);
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const scalar_t* residual = data_or_null<scalar_t>(args.z);
    scalar_t* y = out.mutable_data_ptr<scalar_t>();
    for_each_segment(layout, [&](int64_t c, int64_t offset) {
      const acc_t scale = sigma_inv[c] * w[c];
      for (int64_t i = offset; i < offset + layout.inner; ++i) {
        acc_t v = (acc_t(x[i]) - mu[c]) * scale + b[c];
        if (residual) v += acc_t(residual[i]);
        y[i] = scalar_t(fuse_relu && v < acc_t(0) ? acc_t(0) : v);
      }
    });
  });
}

void CpuKernels::relu_backward(const Tensor& grad_output, const Tensor& input, const NormalizeArgs& args,
                               Layout layout, Tensor& out) {
  // The forward output is recomputed rather than stored: it costs a read of x (and z)
  // instead of keeping a whole activation alive for backward.
  Tensor forward_output = at::empty_like(input);
  batchnorm_forward(input, args, /*fuse_relu=*/false, layout, forward_output);
  at::where_out(out, forward_output > 0, grad_output, at::zeros({}, grad_output.options()));
}

void CpuKernels::reduce_bn(const Tensor& grad_output, const Tensor& input, const Tensor& mean, Layout layout,
                           Tensor& sum_dy, Tensor& sum_dy_xmu) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "syncbn_reduce_bn_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using State = GradSums<acc_t>;
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const scalar_t* dy = grad_output.const_data_ptr<scalar_t>();
    const acc_t* mu = mean.const_data_ptr<acc_t>();
    const int64_t inner = layout.inner, channels = layout.channels;
    auto fold_segment = [&](State& state, int64_t offset) {
      const int64_t c = (offset / inner) % channels;
      acc_t s_dy = 0, s_dy_xmu = 0;
      for (int64_t i = offset; i < offset + inner; ++i) {
        s_dy += acc_t(dy[i]);
        s_dy_xmu += acc_t(dy[i]) * (acc_t(x[i]) - mu[c]);
      }
      state.merge({s_dy, s_dy_xmu});
    };
    auto fold_rows = [&](State* states, int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        for (int64_t c = 0, i = r * channels; c < channels; ++c, ++i) {
          states[c].sum_dy += acc_t(dy[i]);
          states[c].sum_dy_xmu += acc_t(dy[i]) * (acc_t(x[i]) - mu[c]);
        }
      }
    };
    const auto sums = reduce_channels<State>(layout, fold_segment, fold_rows);
    const WriteChannelResults<acc_t> write{sum_dy.mutable_data_ptr<acc_t>(), sum_dy_xmu.mutable_data_ptr<acc_t>()};
    for (int64_t c = 0; c < channels; ++c) write(c, sums[c]);
  });
}

void CpuKernels::batchnorm_backward(const Tensor& grad_output, const Tensor& input, const Tensor& mean,
                                    const Tensor& inv_std, const Tensor& weight, const Tensor& sum_dy,
                                    const Tensor& sum_dy_xmu, const Tensor& count, Layout layout,
                                    Tensor& grad_input) {
  const int64_t total = count.sum().item<int64_t>();
  APEX_CHECK(total > 0, "syncbn.batchnorm_backward: count must sum to a positive number of elements, got ", total);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "syncbn_batchnorm_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const int64_t C = layout.channels;
    const auto mu = to_vector<acc_t>(mean, 0, C), sigma_inv = to_vector<acc_t>(inv_std, 0, C);
    const auto w = to_vector<acc_t>(weight, 1, C);
    const auto s_dy = to_vector<acc_t>(sum_dy, 0, C), s_dy_xmu = to_vector<acc_t>(sum_dy_xmu, 0, C);
    const acc_t inv_total = acc_t(1) / acc_t(total);
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const scalar_t* dy = grad_output.const_data_ptr<scalar_t>();
    scalar_t* dx = grad_input.mutable_data_ptr<scalar_t>();
    for_each_segment(layout, [&](int64_t c, int64_t offset) {
      const acc_t mean_dy = s_dy[c] * inv_total;
      const acc_t xmu_factor = sigma_inv[c] * sigma_inv[c] * s_dy_xmu[c] * inv_total;
      const acc_t scale = sigma_inv[c] * w[c];
      for (int64_t i = offset; i < offset + layout.inner; ++i) {
        dx[i] = scalar_t((acc_t(dy[i]) - mean_dy - (acc_t(x[i]) - mu[c]) * xmu_factor) * scale);
      }
    });
  });
}

}  // namespace apex_syncbn

TORCH_LIBRARY_IMPL(apex, CPU, m) {
  APEX_SYNCBN_REGISTER_KERNELS(m, ::apex_syncbn::CpuKernels);
}
