// fused_dense: CPU epilogue kernels, one pass over the GEMM's output on torch's threads. The GEMMs
// themselves are ATen's (MKL / oneDNN).
#include <ATen/Parallel.h>

#include "dense.h"
#include "dense_math.h"

namespace apex::fused_dense {
namespace {

// Elements per parallel task: big enough that scheduling costs nothing next to the work.
constexpr int64_t kGrainSize = 32768;

}  // namespace

void apply_activation(const Cpu&, const ActivationArgs& args) {
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* input = static_cast<const T*>(args.input);
    T* output = static_cast<T*>(args.output);
    at::parallel_for(0, args.n, kGrainSize, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) output[i] = static_cast<T>(activate(static_cast<A>(input[i]), args.activation));
    });
  });
}

void activation_grad(const Cpu&, const ActivationGradArgs& args) {
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* grad = static_cast<const T*>(args.grad);
    const T* saved = static_cast<const T*>(args.saved);
    T* grad_input = static_cast<T*>(args.grad_input);
    at::parallel_for(0, args.n, kGrainSize, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        grad_input[i] = static_cast<T>(static_cast<A>(grad[i]) *
                                       activation_derivative(static_cast<A>(saved[i]), args.activation));
      }
    });
  });
}

}  // namespace apex::fused_dense
