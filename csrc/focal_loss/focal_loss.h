#pragma once
// focal_loss: sigmoid focal loss of detection heads (RetinaNet), NVIDIA apex's formulation. What the
// kernels take and the kernels, one overload per device.
//
// Logits x [rows, classes] (classes may include padding past num_real_classes), one label per row:
// y >= 0 the positive class, y == -1 background (all classes negative), y == -2 ignored (loss and
// gradient 0). With smoothing s, the target is t = 1 - s/2 for the positive class, s/2 otherwise:
//   loss = sum over rows, real classes of  a * m * BCE(x, t) / num_positives_sum
//   a = alpha, m = (1 - sigmoid(x))^gamma for the positive class; a = 1 - alpha, m = sigmoid(x)^gamma else.
// Padding classes (>= num_real_classes) add nothing and get gradient 0.
#include <type_traits>

#include "apex/device.h"
#include "apex/dtype.h"

namespace apex::focal_loss {

struct Problem {
  const void* logits;              // [rows, classes] contiguous
  const int64_t* labels;           // [rows]
  const float* num_positives_sum;  // [1], on the logits' device
  int64_t rows;
  int64_t classes;
  int64_t real_classes;
  Dtype dtype;
  double alpha;
  double gamma;
  double smoothing;
};

// The kernels' specializations of gamma (focal_loss_math.h): 2 is a square, any other an exponential.
constexpr int kGammaTwo = 2;
constexpr int kAnyGamma = -1;

// Calls f(std::integral_constant<int, kGamma>) with the specialization for p.gamma.
template <class F>
decltype(auto) with_gamma(const Problem& p, F&& f) {
  if (p.gamma == 2.0) return f(std::integral_constant<int, kGammaTwo>{});
  return f(std::integral_constant<int, kAnyGamma>{});
}

// Writes the loss (float32; float64 for float64 logits) to loss[0]. `partials` is scratch of
// partials_size(...) values of the loss dtype.
void forward(const Cpu&, const Problem& problem, void* partials, void* loss);
void forward(const Cuda&, const Problem& problem, void* partials, void* loss);
int64_t partials_size(const Cpu&, const Problem& problem);
int64_t partials_size(const Cuda&, const Problem& problem);

// grad[r, j] = grad_loss[0] * dloss/dx[r, j] (logits' dtype, contiguous); grad_loss has the loss dtype.
void backward(const Cpu&, const Problem& problem, const void* grad_loss, void* grad);
void backward(const Cuda&, const Problem& problem, const void* grad_loss, void* grad);

}  // namespace apex::focal_loss
