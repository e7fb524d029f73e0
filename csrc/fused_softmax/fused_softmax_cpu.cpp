// fused_softmax: CPU kernels. Rows are split over torch's threads; each row is converted to float
// once, masked, and reduced with ATen's Vectorized math (AVX2 in JIT builds).
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "fused_softmax.h"

namespace apex::fused_softmax {
namespace {

using Vec = at::vec::Vectorized<float>;

// Elements per parallel task (rows are split whole).
constexpr int64_t kGrainElements = 32768;

int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(cols, 1)); }

// Columns of row r that can be kept: all, or up to the diagonal.
int64_t kept_columns(bool causal, int64_t r, int64_t queries, int64_t cols) {
  return causal ? std::min(r % queries + 1, cols) : cols;
}

template <class T>
void forward_rows(const ForwardArgs& a, int64_t begin, int64_t end) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> v(a.cols);
  for (int64_t r = begin; r < end; ++r) {
    const T* x = static_cast<const T*>(a.x) + r * a.cols;
    T* y = static_cast<T*>(a.y) + r * a.cols;
    const int64_t kept = kept_columns(a.causal, r, a.queries, a.cols);
    at::vec::convert(x, v.data(), kept);
    const float scale = a.scale;
    at::vec::map([scale](Vec t) { return t * Vec(scale); }, v.data(), v.data(), kept);
    if (a.mask != nullptr) {
      const int64_t q = r % a.queries, h = (r / a.queries) % a.heads, b = r / (a.queries * a.heads);
      const uint8_t* mask = a.mask + b * a.mask_batch_stride + h * a.mask_head_stride + q * a.mask_query_stride;
      for (int64_t j = 0; j < kept; ++j) {
        if (mask[j]) v[j] = kNegInf;
      }
    }
    const float max = kept == 0 ? kNegInf
                                : at::vec::reduce_all([](Vec p, Vec q) { return at::vec::maximum(p, q); }, v.data(), kept);
    // A row with nothing kept (or only -inf scores) is all zeros.
    if (max == kNegInf) {
      std::fill_n(y, a.cols, T(0));
      continue;
    }
    at::vec::map([max](Vec t) { return (t - Vec(max)).exp(); }, v.data(), v.data(), kept);
    const float sum = at::vec::reduce_all([](Vec p, Vec q) { return p + q; }, v.data(), kept);
    const float inv = 1.0f / sum;
    at::vec::map([inv](Vec t) { return t * Vec(inv); }, v.data(), v.data(), kept);
    at::vec::convert(v.data(), y, kept);
    std::fill(y + kept, y + a.cols, T(0));
  }
}

template <class T>
void backward_rows(const BackwardArgs& a, int64_t begin, int64_t end) {
  std::vector<float> g(a.cols), p(a.cols);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t offset = r * a.cols;
    T* dx = static_cast<T*>(a.grad_x) + offset;
    const int64_t kept = kept_columns(a.causal, r, a.queries, a.cols);
    at::vec::convert(static_cast<const T*>(a.grad_y) + offset, g.data(), kept);
    at::vec::convert(static_cast<const T*>(a.y) + offset, p.data(), kept);
    const float dot =
        kept == 0 ? 0.0f
                  : at::vec::map2_reduce_all<float>([](Vec u, Vec w) { return u * w; },
                                                    [](Vec u, Vec w) { return u + w; }, g.data(), p.data(), kept);
    const float scale = a.scale;
    at::vec::map2([scale, dot](Vec u, Vec w) { return Vec(scale) * w * (u - Vec(dot)); }, g.data(), g.data(), p.data(),
                  kept);
    at::vec::convert(g.data(), dx, kept);
    std::fill(dx + kept, dx + a.cols, T(0));
  }
}

}  // namespace

void forward(const Cpu&, const ForwardArgs& args) {
  if (args.rows == 0 || args.cols == 0) return;
  dispatch_floating<false>(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    at::parallel_for(0, args.rows, row_grain(args.cols),
                     [&](int64_t begin, int64_t end) { forward_rows<T>(args, begin, end); });
  });
}

void backward(const Cpu&, const BackwardArgs& args) {
  if (args.rows == 0 || args.cols == 0) return;
  dispatch_floating<false>(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    at::parallel_for(0, args.rows, row_grain(args.cols),
                     [&](int64_t begin, int64_t end) { backward_rows<T>(args, begin, end); });
  });
}

}  // namespace apex::fused_softmax
