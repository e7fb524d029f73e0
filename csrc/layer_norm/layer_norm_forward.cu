// LayerNorm / RMSNorm forward on CUDA: picks the kernels of the call's dtypes, each pair compiled
// in a file of its own (layer_norm_forward_<dtypes>.cu, kernels in layer_norm_forward.cuh).
#include "layer_norm_cuda.cuh"

namespace apex::layer_norm {

void forward(const Cuda& device, const ForwardArgs& args) {
  dispatch_input_and_output(args.input_dtype, args.output_dtype, [&](auto t, auto w) {
    forward_typed<typename decltype(t)::type, typename decltype(w)::type>(device, args);
  });
}

bool stream_is_capturing(const Cuda& device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cuda::check(cudaStreamIsCapturing(cuda::stream(device), &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace apex::layer_norm
