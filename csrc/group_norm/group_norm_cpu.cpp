// group_norm: CPU kernels. Work is split over (sample, group) pairs; each reads its group twice
// (moments, then the outputs), straight from the layout's strides. Per-channel weight and bias
// gradients are gathered per pair and then summed over samples in order (no races, the same
// result for any thread count).
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "apex/acc_type.h"
#include "group_norm.h"
#include "group_norm_math.h"

namespace apex::group_norm {
namespace {

// Calls f(offset, channel) for every element of group g of sample n, channel by channel.
template <class F>
void for_each_in_group(const Shape& shape, int64_t n, int64_t g, F&& f) {
  const int64_t per_group = shape.channels / shape.groups;
  for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
    for (int64_t s = 0; s < shape.spatial; ++s) {
      f(shape.layout == Layout::kNhwc ? (n * shape.spatial + s) * shape.channels + c
                                      : (n * shape.channels + c) * shape.spatial + s,
        c);
    }
  }
}

int64_t grain(const Shape& shape) {
  constexpr int64_t kGrainElements = 1 << 15;  // per task: scheduling costs nothing next to it
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, shape.channels / shape.groups * shape.spatial));
}

template <class Acc>
Acc param(const void* p, int64_t c, Acc absent) {
  return p == nullptr ? absent : static_cast<const Acc*>(p)[c];
}

template <class T>
void forward_groups(const ForwardArgs& a) {
  using Acc = acc_type<T>;
  const Shape& shape = a.shape;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const Acc count = static_cast<Acc>(shape.channels / shape.groups * shape.spatial);
  at::parallel_for(0, shape.samples * shape.groups, grain(shape), [&](int64_t begin, int64_t end) {
    for (int64_t id = begin; id < end; ++id) {
      const int64_t n = id / shape.groups, g = id % shape.groups;
      Acc shift = 0, sum = 0, squares = 0;
      bool first = true;
      for_each_in_group(shape, n, g, [&](int64_t i, int64_t) {
        const Acc v = static_cast<Acc>(x[i]);
        if (first) shift = v, first = false;
        sum += v - shift;
        squares += (v - shift) * (v - shift);
      });
      const Moments<Acc> m = moments(sum, squares, shift, count, a.eps);
      static_cast<Acc*>(a.mean)[id] = m.mean;
      static_cast<Acc*>(a.rstd)[id] = m.rstd;
      for_each_in_group(shape, n, g, [&](int64_t i, int64_t c) {
        const Acc z = (static_cast<Acc>(x[i]) - m.mean) * m.rstd * param(a.weight, c, Acc(1)) + param(a.bias, c, Acc(0));
        y[i] = static_cast<T>(activate(z, a.silu));
      });
    }
  });
}

template <class T>
void backward_groups(const BackwardArgs& a) {
  using Acc = acc_type<T>;
  const Shape& shape = a.shape;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  T* dx = static_cast<T*>(a.dx);
  const int64_t per_group = shape.channels / shape.groups;
  const Acc count = static_cast<Acc>(per_group * shape.spatial);
  // Per (sample, channel): sum of dz * xhat and of dz, summed over samples afterwards.
  std::vector<Acc> channel_sums(shape.samples * shape.channels * 2, Acc(0));
  at::parallel_for(0, shape.samples * shape.groups, grain(shape), [&](int64_t begin, int64_t end) {
    for (int64_t id = begin; id < end; ++id) {
      const int64_t n = id / shape.groups, g = id % shape.groups;
      const Acc mean = static_cast<const Acc*>(a.mean)[id], rstd = static_cast<const Acc*>(a.rstd)[id];
      Acc* sums = channel_sums.data() + n * shape.channels * 2;
      const auto terms = [&](int64_t i, int64_t c, Acc& xhat, Acc& w) {
        xhat = (static_cast<Acc>(x[i]) - mean) * rstd;
        w = param(a.weight, c, Acc(1));
        const Acc z = xhat * w + param(a.bias, c, Acc(0));
        return static_cast<Acc>(dy[i]) * activation_slope(z, a.silu);  // dz
      };
      Acc weighted = 0, weighted_xhat = 0;
      for_each_in_group(shape, n, g, [&](int64_t i, int64_t c) {
        Acc xhat, w;
        const Acc dz = terms(i, c, xhat, w);
        weighted += w * dz;
        weighted_xhat += w * dz * xhat;
        sums[2 * c] += dz * xhat;
        sums[2 * c + 1] += dz;
      });
      const Acc c1 = weighted / count, c2 = weighted_xhat / count;
      for_each_in_group(shape, n, g, [&](int64_t i, int64_t c) {
        Acc xhat, w;
        const Acc dz = terms(i, c, xhat, w);
        dx[i] = static_cast<T>(rstd * (w * dz - c1 - xhat * c2));
      });
    }
  });
  if (a.grad_weight == nullptr && a.grad_bias == nullptr) return;
  at::parallel_for(0, shape.channels, 256, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      Acc dw = 0, db = 0;
      for (int64_t n = 0; n < shape.samples; ++n) {
        dw += channel_sums[(n * shape.channels + c) * 2];
        db += channel_sums[(n * shape.channels + c) * 2 + 1];
      }
      if (a.grad_weight != nullptr) static_cast<Acc*>(a.grad_weight)[c] = dw;
      if (a.grad_bias != nullptr) static_cast<Acc*>(a.grad_bias)[c] = db;
    }
  });
}

}  // namespace

void forward(const Cpu&, const ForwardArgs& args) {
  dispatch_floating(args.dtype, [&](auto tag) { forward_groups<typename decltype(tag)::type>(args); });
}

void backward(const Cpu&, const BackwardArgs& args) {
  dispatch_floating(args.dtype, [&](auto tag) { backward_groups<typename decltype(tag)::type>(args); });
}

}  // namespace apex::group_norm
