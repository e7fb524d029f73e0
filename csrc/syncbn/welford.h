// Welford statistics shared by the CPU and CUDA kernels.
//
// A (count, mean, m2) triple summarises a set of values: m2 is the sum of squared
// deviations from the mean. Two triples merge exactly (Chan et al.), which is what
// lets per-thread, per-block and per-rank partial statistics combine without the
// cancellation that sum / sum-of-squares formulas suffer when |mean| >> std.
#pragma once

#include <c10/macros/Macros.h>
#include <cstdint>

namespace apex::syncbn {

// The two per-channel results of a reduction, in the order the ops return them.
template <typename acc_t>
struct ChannelResults {
  acc_t first;
  acc_t second;
};

template <typename acc_t>
struct WelfordState {
  acc_t mean;
  acc_t m2;
  int64_t count;

  C10_HOST_DEVICE static WelfordState empty() { return {acc_t(0), acc_t(0), 0}; }

  // Folds in another partial result. An empty side leaves the other untouched,
  // so ranks or blocks that saw no elements are harmless.
  C10_HOST_DEVICE void merge(const WelfordState& other) {
    if (other.count == 0) return;
    if (count == 0) {
      *this = other;
      return;
    }
    const int64_t total = count + other.count;
    const acc_t other_share = acc_t(other.count) / acc_t(total);
    const acc_t delta = other.mean - mean;
    mean += delta * other_share;
    m2 += other.m2 + delta * delta * acc_t(count) * other_share;
    count = total;
  }

  // Folds in one value whose reciprocal running count the caller already knows
  // (channels-last loops share it across all channels of a row).
  C10_HOST_DEVICE void push(acc_t value, acc_t inv_new_count) {
    const acc_t delta = value - mean;
    mean += delta * inv_new_count;
    m2 += delta * (value - mean);
  }

  C10_HOST_DEVICE acc_t biased_var() const { return count > 0 ? m2 / acc_t(count) : acc_t(0); }

  // (mean, biased variance): what welford_mean_var returns.
  C10_HOST_DEVICE ChannelResults<acc_t> results() const { return {mean, biased_var()}; }
};

// Sums the backward pass reduces per channel: sum(dy) and sum(dy * (x - mean)).
template <typename acc_t>
struct GradSums {
  acc_t sum_dy;
  acc_t sum_dy_xmu;

  C10_HOST_DEVICE static GradSums empty() { return {acc_t(0), acc_t(0)}; }

  C10_HOST_DEVICE void merge(const GradSums& other) {
    sum_dy += other.sum_dy;
    sum_dy_xmu += other.sum_dy_xmu;
  }
};

// Writes each channel's results (a WelfordState's mean and biased variance) into two [C] outputs.
template <typename acc_t>
struct WriteChannelResults {
  acc_t* first;
  acc_t* second;

  template <typename State>
  C10_HOST_DEVICE void operator()(int64_t channel, const State& state) const {
    const ChannelResults<acc_t> results = state.results();
    first[channel] = results.first;
    second[channel] = results.second;
  }
};

// Writes each channel's gradient sums, and where asked the weight's gradient sum_dy_xmu * inv_std.
template <typename acc_t>
struct WriteGradSums {
  acc_t* sum_dy;
  acc_t* sum_dy_xmu;
  const acc_t* inv_std;
  acc_t* grad_weight;  // or null

  C10_HOST_DEVICE void operator()(int64_t channel, const GradSums<acc_t>& sums) const {
    sum_dy[channel] = sums.sum_dy;
    sum_dy_xmu[channel] = sums.sum_dy_xmu;
    if (grad_weight) grad_weight[channel] = sums.sum_dy_xmu * inv_std[channel];
  }
};

}  // namespace apex::syncbn
