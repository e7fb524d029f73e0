// fused_dense: CUDA elementwise kernels for what cuBLASLt's epilogues do not fuse (exact GELU, sigmoid,
// float32 GELU, the epilogue of any GEMM cuBLASLt declined) and for the activations' derivatives in
// backward: one pass over the GEMM's output, 16-byte accesses, a grid-stride loop.
#include "apex/cuda.cuh"
#include "dense.h"
#include "dense_math.h"

namespace apex::fused_dense {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // resident warps enough to hide memory latency

// out[i] = activation(x[i]) (kGrad false) or x[i] * activation'(saved[i]) (kGrad true), computed in
// acc_t<T>, over n elements: packs of kVec (16-byte accesses, the pointers aligned), then the tail
// that fills no whole pack element by element.
template <class T, int kVec, bool kGrad>
__global__ void activation_kernel(const T* x, const T* saved, T* out, int64_t n, Activation activation) {
  using A = acc_t<T>;
  auto one = [activation](T value, T saved_value) {
    if constexpr (kGrad) {
      return static_cast<T>(static_cast<A>(value) * activation_derivative(static_cast<A>(saved_value), activation));
    } else {
      return static_cast<T>(activate(static_cast<A>(value), activation));
    }
  };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / kVec;
  for (int64_t p = first; p < packs; p += stride) {
    auto v = load_vector<kVec>(x, p * kVec);
    decltype(v) s{};
    if constexpr (kGrad) s = load_vector<kVec>(saved, p * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v.value[j] = one(v.value[j], s.value[j]);
    store_vector<kVec>(out, p * kVec, v);
  }
  for (int64_t i = packs * kVec + first; i < n; i += stride) {
    out[i] = one(x[i], kGrad ? saved[i] : T(0));
  }
}

template <bool kGrad>
void launch_activation(const Cuda& device, const void* x, const void* saved, void* out, int64_t n, Dtype dtype,
                       Activation activation) {
  if (n == 0) return;
  dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vector_width<T>();
    const T* x_t = static_cast<const T*>(x);
    const T* saved_t = static_cast<const T*>(saved);
    T* out_t = static_cast<T*>(out);
    const cudaStream_t stream = cuda::stream(device);
    if (is_aligned(x_t) && is_aligned(out_t) && (!kGrad || is_aligned(saved_t))) {
      const unsigned blocks = cuda::grid_size(n / kVec + 1, kThreads, kBlocksPerSm, device);
      activation_kernel<T, kVec, kGrad><<<blocks, kThreads, 0, stream>>>(x_t, saved_t, out_t, n, activation);
    } else {
      const unsigned blocks = cuda::grid_size(n, kThreads, kBlocksPerSm, device);
      activation_kernel<T, 1, kGrad><<<blocks, kThreads, 0, stream>>>(x_t, saved_t, out_t, n, activation);
    }
  });
  cuda::check_launch(kGrad ? "fused_dense: activation_grad" : "fused_dense: activation");
}

}  // namespace

void apply_activation(const Cuda& device, const ActivationArgs& args) {
  launch_activation<false>(device, args.input, nullptr, args.output, args.n, args.dtype, args.activation);
}

void activation_grad(const Cuda& device, const ActivationGradArgs& args) {
  launch_activation<true>(device, args.grad, args.saved, args.grad_input, args.n, args.dtype, args.activation);
}

}  // namespace apex::fused_dense
