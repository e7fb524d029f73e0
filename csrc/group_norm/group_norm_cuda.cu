// group_norm: the CUDA entry points. The kernels and their launches are in group_norm_kernels.cuh,
// instantiated by the group_norm_{forward,backward}_*.cu units; this unit compiles host code only.
#include "group_norm_kernels.cuh"

namespace apex::group_norm {

int64_t workspace_bytes(const Cuda& device, const Shape& shape, Dtype dtype) {
  if (shape.samples == 0 || shape.channels == 0 || shape.spatial == 0) return 0;
  int64_t bytes = 0;
  dispatch_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // The plan's vector width depends on the pointers' alignment: room for either.
    for (const int vec : {vector_width<T>(), 1}) {
      if (shape.layout == Layout::kNhwc ? shape.channels % vec : shape.spatial % vec) continue;
      // As many blocks resident as the SM has threads for, and no split cap: an upper bound of
      // either direction's sums grid, so of its splits.
      const Plan any = plan_for(shape, vec, device, 1);
      const int most_resident = std::max(1, kMaxThreadsPerSm / any.threads);
      bytes = std::max(bytes, carved_bytes<acc_type<T>>(plan_for(shape, vec, device, most_resident)));
    }
  });
  return bytes;
}

void forward(const Cuda& device, const ForwardArgs& args) {
  const Shape& shape = args.shape;
  if (shape.samples == 0 || shape.channels == 0 || shape.spatial == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_as<T>(device, args);
  });
}

void backward(const Cuda& device, const BackwardArgs& args) {
  const Shape& shape = args.shape;
  if (shape.channels == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_type<T>;
    if (shape.samples == 0 || shape.spatial == 0) {  // no elements: the parameter gradients are zeros
      for (void* grad : {args.grad_weight, args.grad_bias}) {
        if (grad != nullptr) {
          cuda::check(cudaMemsetAsync(grad, 0, sizeof(Acc) * shape.channels, cuda::stream(device)), "group_norm_backward");
        }
      }
      return;
    }
    backward_as<T>(device, args);
  });
}

}  // namespace apex::group_norm
