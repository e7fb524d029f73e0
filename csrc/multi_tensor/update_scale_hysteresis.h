// update_scale_hysteresis: amp's dynamic loss-scale update with hysteresis (Megatron): the
// scale backs off only after `hysteresis` consecutive overflowing steps, and grows by
// growth_factor after growth_interval clean steps. All state is on the device, one element each.
#pragma once

#include "apex/multi_tensor_kernel.h"

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

void update_scale_hysteresis(const Cpu&, const ScaleHysteresisUpdate& update);
void update_scale_hysteresis(const Cuda&, const ScaleHysteresisUpdate& update);

}  // namespace apex::multi_tensor
