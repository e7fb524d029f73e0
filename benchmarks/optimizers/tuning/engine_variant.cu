// amp_C's fp32 AdamW step, grad L2 norm and unscale built with one variant of the CUDA multi-tensor
// engine, chosen by compile-time defines, for tune_engine.py to time side by side: TUNE_THREADS,
// TUNE_ELEMS_FEW, TUNE_ELEMS_MANY, TUNE_MIN_BLOCKS (the engine's cuda::LaunchConfig).
#include "apex/multi_tensor_apply.cuh"
#include "engine_variant.h"

namespace mt = apex::multi_tensor;
using Config = mt::cuda::LaunchConfig<TUNE_THREADS, TUNE_ELEMS_FEW, TUNE_ELEMS_MANY, TUNE_MIN_BLOCKS>;
using Engine = mt::CudaEngineWith<Config>;
using Float1 = mt::TypeList<float>;
using Float2 = mt::TypeList<float, float>;
using Float4 = mt::TypeList<float, float, float, float>;

namespace tune {

void adamw(const Cuda& device, const TensorLists& lists, int* flag, const mt::AdamFunctor& op) {
  Engine::elementwise<Float4>(device, lists, flag, op);
}

void l2norm(const Cuda& device, const TensorLists& lists, int* flag, const mt::NormArgs& args) {
  Engine::reduce<Float1>(device, lists, flag, args.square, args.out);
}

void scale(const Cuda& device, const TensorLists& lists, int* flag, const mt::ScaleFunctor& op) {
  Engine::elementwise<Float2>(device, lists, flag, op);
}

int64_t scratch(const Cuda& device, int64_t count) { return mt::cuda::reduction_scratch_for<Config>(device, count); }

std::vector<int64_t> blocks_per_sm(const Cuda& device) {
  const int64_t sms = apex::cuda::sm_count(device.device);
  return {mt::cuda::resident_blocks<Float4, mt::AdamFunctor, Config>(device) / sms,
          mt::cuda::resident_blocks<Float1, mt::SquareFunctor, Config>(device) / sms,
          mt::cuda::resident_blocks<Float2, mt::ScaleFunctor, Config>(device) / sms};
}

}  // namespace tune
