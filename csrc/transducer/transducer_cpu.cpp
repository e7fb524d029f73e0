// transducer: CPU kernels, with the CUDA kernels' formulas (transducer_math.h). Lattice rows are
// split over torch's threads; alpha and beta run per batch element.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "transducer.h"
#include "transducer_math.h"

namespace apex::transducer {
namespace {

// Elements per parallel task: enough work that scheduling costs nothing next to it.
constexpr int64_t kGrainElements = 1 << 15;

int64_t grain(int64_t width) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(width, 1)); }

template <class T>
void joint_forward_rows(const JointArgs& a) {
  const Lattice& l = a.lattice;
  const T* f = static_cast<const T*>(a.f);
  const T* g = static_cast<const T*>(a.g);
  T* h = static_cast<T*>(a.h);
  at::parallel_for(0, l.rows, grain(a.width), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const Cell c = cell_of(l, row);
      T* out = h + row * a.width;
      uint8_t* mask = a.mask == nullptr ? nullptr : a.mask + row * a.width;
      const T* fr = f + (c.b * l.max_t + c.t) * a.width;
      const T* gr = g + (c.b * l.max_u + c.u) * a.width;
      for (int64_t k = 0; k < a.width; ++k) {
        bool pass = c.valid;
        float v = -1.0f;
        if (c.valid) {
          v = static_cast<float>(fr[k]) + static_cast<float>(gr[k]);
          pass = !(a.relu && v <= 0.0f) && (a.keep == nullptr || a.keep[row * a.width + k]);
          v = pass ? (a.keep != nullptr ? v * a.scale : v) : 0.0f;
        }
        out[k] = static_cast<T>(v);
        if (mask != nullptr) mask[k] = pass;
      }
    }
  });
}

// f_grad (over_t = false: rows (b, t), summing over u) or g_grad (over_t: rows (b, u), over t).
template <class T>
void joint_backward_rows(const JointBackwardArgs& a, bool over_t) {
  const Lattice& l = a.lattice;
  const T* h_grad = static_cast<const T*>(a.h_grad);
  const T* f = static_cast<const T*>(a.f);
  const T* g = static_cast<const T*>(a.g);
  const bool relu = a.mask == nullptr && f != nullptr;  // the forward's ReLU test, recomputed
  T* out = static_cast<T*>(over_t ? a.g_grad : a.f_grad);
  const int64_t outer = over_t ? l.max_u : l.max_t;
  at::parallel_for(0, l.batch * outer, grain(a.width), [&](int64_t begin, int64_t end) {
    std::vector<float> sum(a.width);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / outer, fixed = row % outer;
      const bool inside = over_t ? fixed < l.u_len[b] : fixed < l.t_len[b];
      const int64_t count = inside ? (over_t ? l.t_len[b] : l.u_len[b]) : 0;
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t t = over_t ? i : fixed, u = over_t ? fixed : i;
        const int64_t at = row_of(l, b, t, u) * a.width;
        if (relu) {
          if (u >= l.max_u) continue;  // bad packed lengths: nothing to recompute from
          const T* fr = f + (b * l.max_t + t) * a.width;
          const T* gr = g + (b * l.max_u + u) * a.width;
          for (int64_t k = 0; k < a.width; ++k) {
            const bool pass = !(static_cast<float>(fr[k]) + static_cast<float>(gr[k]) <= 0.0f);
            if (pass) sum[k] += static_cast<float>(h_grad[at + k]);
          }
          continue;
        }
        for (int64_t k = 0; k < a.width; ++k) {
          if (a.mask == nullptr || a.mask[at + k]) sum[k] += static_cast<float>(h_grad[at + k]);
        }
      }
      for (int64_t k = 0; k < a.width; ++k) out[row * a.width + k] = static_cast<T>(sum[k] * a.scale);
    }
  });
}

// log-sum-exp of a row, in float (double rows: double).
template <class T>
float row_log_sum_exp(const T* x, int64_t n, std::vector<float>& buffer) {
  using Vec = at::vec::Vectorized<float>;
  buffer.resize(n);
  for (int64_t v = 0; v < n; ++v) buffer[v] = static_cast<float>(x[v]);
  const float max = at::vec::reduce_all<float>([](Vec p, Vec q) { return at::vec::maximum(p, q); }, buffer.data(), n);
  const float base = max == -std::numeric_limits<float>::infinity() ? 0.0f : max;
  const float sum = at::vec::map_reduce_all<float>([base](Vec v) { return (v - Vec(base)).exp(); },
                                                   [](Vec p, Vec q) { return p + q; }, buffer.data(), n);
  return base + std::log(sum);
}

template <class T>
void loss_forward_all(const LossArgs& a) {
  const Lattice& l = a.lattice;
  const T* x = static_cast<const T*>(a.x);
  if (a.classes > 0) {
    at::parallel_for(0, l.rows, grain(a.classes), [&](int64_t begin, int64_t end) {
      std::vector<float> buffer;
      for (int64_t row = begin; row < end; ++row) {
        const Cell c = cell_of(l, row);
        if (!c.valid) {
          a.lse[row] = a.blank_logp[row] = a.label_logp[row] = 0.0f;
          continue;
        }
        const T* logits = x + row * a.classes;
        const float lse = row_log_sum_exp(logits, a.classes, buffer);
        const auto logp = [&](int64_t v) { return static_cast<float>(static_cast<T>(static_cast<float>(logits[v]) - lse)); };
        a.lse[row] = lse;
        a.blank_logp[row] = logp(a.blank);
        a.label_logp[row] = c.u + 1 < l.u_len[c.b] ? logp(a.labels[c.b * a.label_stride + c.u]) : 0.0f;
      }
    });
  }
  at::parallel_for(0, l.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t t_len = l.t_len[b], u_len = l.u_len[b];
      for (int64_t t = 0; t < t_len; ++t) {
        for (int64_t u = 0; u < u_len; ++u) a.alpha[(b * l.max_t + t) * l.max_u + u] = alpha_at(a, b, t, u);
      }
      for (int64_t t = t_len - 1; t >= 0; --t) {
        for (int64_t u = u_len - 1; u >= 0; --u) a.beta[(b * l.max_t + t) * l.max_u + u] = beta_at(a, b, t, u);
      }
      const float loss = t_len > 0 && u_len > 0 ? -a.beta[b * l.max_t * l.max_u] : 0.0f;
      static_cast<T*>(a.loss)[b] = static_cast<T>(loss);
    }
  });
}

template <class T>
void loss_backward_all(const LossBackwardArgs& args) {
  const LossArgs& a = args.forward;
  const Lattice& l = a.lattice;
  const T* x = static_cast<const T*>(a.x);
  T* grad = static_cast<T*>(args.grad);
  at::parallel_for(0, l.rows, grain(a.classes), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const Cell c = cell_of(l, row);
      T* out = grad + row * a.classes;
      if (!c.valid) {
        std::fill(out, out + a.classes, T(0));
        continue;
      }
      const T* logits = x + row * a.classes;
      const float g = args.grad_loss[c.b], lse = a.lse[row];
      const CellGrad terms = cell_grad(a, c.b, c.t, c.u);
      const float scale = args.fused_softmax ? g * terms.occupancy : 0.0f;
      const int64_t label = c.u + 1 < l.u_len[c.b] ? a.labels[c.b * a.label_stride + c.u] : -1;
      for (int64_t v = 0; v < a.classes; ++v) {
        const float through = (v == a.blank ? terms.through_blank : 0.0f) + (v == label ? terms.through_label : 0.0f);
        out[v] = static_cast<T>(scale * std::exp(static_cast<float>(logits[v]) - lse) - g * through);
      }
    }
  });
}

}  // namespace

void joint_forward(const Cpu&, const JointArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) { joint_forward_rows<typename decltype(tag)::type>(a); });
}

int64_t joint_backward_workspace(const Cpu&, const JointBackwardArgs&) { return 0; }

void joint_backward(const Cpu&, const JointBackwardArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) {
    joint_backward_rows<typename decltype(tag)::type>(a, false);
    joint_backward_rows<typename decltype(tag)::type>(a, true);
  });
}

void loss_forward(const Cpu&, const LossArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) { loss_forward_all<typename decltype(tag)::type>(a); });
}

void loss_backward(const Cpu&, const LossBackwardArgs& args) {
  dispatch_floating(args.forward.dtype, [&](auto tag) { loss_backward_all<typename decltype(tag)::type>(args); });
}

}  // namespace apex::transducer
