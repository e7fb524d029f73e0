#pragma once
// The formulas the CPU and CUDA kernels share (host and device).
#include <c10/macros/Macros.h>

#include <cstdint>
#include <limits>

namespace apex::xentropy {

enum class Label : int8_t { kIgnored, kValid, kOutOfRange };

C10_HOST_DEVICE inline Label classify(int64_t label, int64_t ignore_index, int64_t classes) {
  if (label == ignore_index) return Label::kIgnored;
  return label >= 0 && label < classes ? Label::kValid : Label::kOutOfRange;
}

// -(1 - s) * log p_y - s * mean_j log p_j, from the row's log-sum-exp, its label's logit and the
// sum of its logits. Without smoothing the sum takes no part: a -inf logit (a masked class) makes it
// -inf, and 0 * -inf would be NaN where torch gives the finite -log p_y.
template <class Acc>
C10_HOST_DEVICE inline Acc row_loss(Acc lse, Acc label_logit, Acc logit_sum, int64_t classes, double smoothing) {
  const Acc s = static_cast<Acc>(smoothing);
  const Acc smoothed = smoothing == 0.0 ? Acc(0) : s * logit_sum / static_cast<Acc>(classes);
  return lse - (Acc(1) - s) * label_logit - smoothed;
}

// dloss/dx_j = g * (p_j - s / V - (1 - s) [j == y]) = g * p_j - uniform - (j == y ? target : 0).
template <class Acc>
struct GradTerms {
  Acc uniform;  // g * s / V, subtracted from every class
  Acc target;   // g * (1 - s), subtracted from the label's class
};

template <class Acc>
C10_HOST_DEVICE inline GradTerms<Acc> grad_terms(Acc g, int64_t classes, double smoothing) {
  const Acc s = static_cast<Acc>(smoothing);
  return {g * s / static_cast<Acc>(classes), g * (Acc(1) - s)};
}

template <class Acc>
C10_HOST_DEVICE inline Acc quiet_nan() {
  return std::numeric_limits<Acc>::quiet_NaN();
}

}  // namespace apex::xentropy
