// update_scale_hysteresis: amp's dynamic loss-scale update with hysteresis (Megatron): the
// scale backs off only after `hysteresis` consecutive overflowing steps, and grows by
// growth_factor after growth_interval clean steps. All state is on the device, one element each.
#pragma once

#include <torch/library.h>

#include "apex/multi_tensor_apply_common.h"

namespace apex::multi_tensor {

struct ScaleHysteresisUpdate {
  float* current_scale;
  int* growth_tracker;
  int* hysteresis_tracker;
  const float* found_inf;
  double growth_factor, backoff_factor;
  int growth_interval, hysteresis;

  APEX_HD void operator()() const {
    const bool overflow = *found_inf > 0.f;
    if (overflow) {
      *hysteresis_tracker -= 1;
      // Still within the tolerated overflows: keep the scale, restart the growth count.
      if (*hysteresis_tracker > 0) {
        *growth_tracker = 0;
        return;
      }
      *current_scale = static_cast<float>(*current_scale * backoff_factor);
      *growth_tracker = 0;
      return;
    }
    const int successful = *growth_tracker + 1;
    if (successful == growth_interval) {
      const float grown = static_cast<float>(*current_scale * growth_factor);
      // Never grow past the float range to inf.
      if (ScalarMath<float>::isfinite(grown)) *current_scale = grown;
      *growth_tracker = 0;
    } else {
      *growth_tracker = successful;
    }
    *hysteresis_tracker = hysteresis;
  }
};

template <class Engine>
void amp_update_scale_hysteresis(const at::Tensor& current_scale, const at::Tensor& growth_tracker,
                                 const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                                 double growth_factor, double backoff_factor, int64_t growth_interval,
                                 int64_t hysteresis) {
  constexpr const char* kName = "update_scale_hysteresis";
  check_scalar_tensor(kName, current_scale, current_scale, "current_scale", {at::kFloat});
  check_scalar_tensor(kName, growth_tracker, current_scale, "growth_tracker", {at::kInt});
  check_scalar_tensor(kName, hysteresis_tracker, current_scale, "hysteresis_tracker", {at::kInt});
  check_scalar_tensor(kName, found_inf, current_scale, "found_inf", {at::kFloat});
  APEX_CHECK(growth_interval > 0, kName, ": growth_interval must be positive, got ", growth_interval);
  ScaleHysteresisUpdate update{current_scale.data_ptr<float>(), growth_tracker.data_ptr<int>(),
                               hysteresis_tracker.data_ptr<int>(), found_inf.data_ptr<float>(), growth_factor,
                               backoff_factor, static_cast<int>(growth_interval), static_cast<int>(hysteresis)};
  Engine::run_once(current_scale, update);
}

// Registers this file's ops for the dispatch key of `m` (CPU or CUDA), run by `Engine`.
template <class Engine>
void register_update_scale_kernels(torch::Library& m) {
  m.impl("amp_update_scale_hysteresis", &amp_update_scale_hysteresis<Engine>);
}

}  // namespace apex::multi_tensor
