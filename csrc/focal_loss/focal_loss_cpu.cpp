// focal_loss: CPU kernels. Rows are cut into fixed chunks (not per thread), each summed into its own
// partial and the partials added in order, so the loss does not depend on the thread count.
// The loss is a sum of up to ~10^8 small terms: they are added in Acc only in short runs, and the runs
// in double, so the rounding error does not grow with the element count.
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>

#include "apex/acc_type.h"
#include "focal_loss.h"
#include "focal_loss_math.h"

namespace apex::focal_loss {
namespace {

// Logits per chunk: enough work per task that scheduling costs nothing next to it.
constexpr int64_t kChunkElements = 1 << 15;

int64_t rows_per_chunk(const Problem& p) { return std::max<int64_t>(1, kChunkElements / std::max<int64_t>(p.classes, 1)); }

int64_t chunks(const Problem& p) { return (p.rows + rows_per_chunk(p) - 1) / rows_per_chunk(p); }

// Terms of a row added in Acc before the run goes into the double sum: the run's rounding stays
// ~kRun * 2^-24 relative at worst, far under the loss tolerance, while the one double add per run
// costs nothing beside kRun exp/log evaluations.
constexpr int64_t kRun = 128;

}  // namespace

// The chunks' partials are doubles; the scratch is counted in values of the loss dtype.
int64_t partials_size(const Cpu&, const Problem& p) {
  return chunks(p) * (p.dtype == Dtype::kFloat64 ? 1 : int64_t{sizeof(double) / sizeof(float)});
}

void forward(const Cpu&, const Problem& p, void* partials, void* loss) {
  dispatch_floating(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_type<T>;
    const T* logits = static_cast<const T*>(p.logits);
    double* sums = static_cast<double*>(partials);
    const Acc alpha = p.alpha, gamma = p.gamma, u = p.smoothing / 2;
    const int64_t per_chunk = rows_per_chunk(p), count = chunks(p);
    with_gamma(p, [&](auto gamma_kind) {
      constexpr int kGamma = decltype(gamma_kind)::value;
      at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
        for (int64_t chunk = begin; chunk < end; ++chunk) {
          double sum = 0;
          for (int64_t row = chunk * per_chunk; row < std::min(p.rows, (chunk + 1) * per_chunk); ++row) {
            const int64_t label = p.labels[row];
            if (label == kIgnored) continue;
            for (int64_t start = 0; start < p.real_classes; start += kRun) {
              Acc run = 0;
              for (int64_t j = start; j < std::min(p.real_classes, start + kRun); ++j) {
                run += focal_element<kGamma, false, Acc>(static_cast<Acc>(logits[row * p.classes + j]), j == label,
                                                         alpha, gamma, u)
                           .loss;
              }
              sum += run;
            }
          }
          sums[chunk] = sum;
        }
      });
    });
    double total = 0;
    for (int64_t chunk = 0; chunk < count; ++chunk) total += sums[chunk];
    *static_cast<Acc*>(loss) = static_cast<Acc>(total / static_cast<double>(*p.num_positives_sum));
  });
}

void backward(const Cpu&, const Problem& p, const void* grad_loss, void* grad_out) {
  dispatch_floating(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_type<T>;
    const T* logits = static_cast<const T*>(p.logits);
    T* grad = static_cast<T*>(grad_out);
    const Acc scale = *static_cast<const Acc*>(grad_loss) / static_cast<Acc>(*p.num_positives_sum);
    const Acc alpha = p.alpha, gamma = p.gamma, u = p.smoothing / 2;
    with_gamma(p, [&](auto gamma_kind) {
      constexpr int kGamma = decltype(gamma_kind)::value;
      at::parallel_for(0, p.rows, rows_per_chunk(p), [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const int64_t label = p.labels[row];
          T* out = grad + row * p.classes;
          for (int64_t j = 0; j < p.classes; ++j) {
            const bool counted = label != kIgnored && j < p.real_classes;
            out[j] = counted ? static_cast<T>(scale * focal_element<kGamma, true, Acc>(
                                                          static_cast<Acc>(logits[row * p.classes + j]), j == label,
                                                          alpha, gamma, u)
                                                          .grad)
                             : T(0);
          }
        }
      });
    });
  });
}

}  // namespace apex::focal_loss
