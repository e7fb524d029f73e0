// LayerNorm / RMSNorm backward on CUDA: picks the kernels of the call's dtypes and norm, each compiled
// in a file of its own (layer_norm_backward_<dtypes>[_rms].cu, kernels in layer_norm_backward.cuh).
#include "layer_norm_cuda.cuh"

namespace apex::layer_norm {

void backward(const Cuda& device, const BackwardArgs& args, const Scratch& scratch) {
  dispatch_input_and_output(args.input_dtype, args.output_dtype, [&](auto t, auto w) {
    dispatch_bool(args.rms, [&](auto rms) {
      backward_typed<typename decltype(t)::type, typename decltype(w)::type, decltype(rms)::value>(device, args,
                                                                                                 scratch);
    });
  });
}

}  // namespace apex::layer_norm
