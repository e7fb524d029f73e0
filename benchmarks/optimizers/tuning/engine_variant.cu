// The fp32 AdamW step, grad L2 norm and unscale of amp_C built with one variant of the CUDA
// multi-tensor engine, chosen by compile-time defines, for tune_engine.py to time side by side:
// TUNE_THREADS, TUNE_ELEMS_FEW, TUNE_ELEMS_MANY, TUNE_MIN_BLOCKS (the engine's cuda::LaunchConfig).
// The Python binding is engine_variant_binding.cpp (torch/extension.h through nvcc builds slowly).
#include "engine_variant.h"

#include "adam.h"
#include "apex/multi_tensor_apply.cuh"
#include "l2norm.h"
#include "scale.h"

using Config =
    apex::multi_tensor::cuda::LaunchConfig<TUNE_THREADS, TUNE_ELEMS_FEW, TUNE_ELEMS_MANY, TUNE_MIN_BLOCKS>;
using Engine = apex::multi_tensor::CudaEngineWith<Config>;

namespace mt = apex::multi_tensor;

namespace tune {

constexpr int64_t kChunk = 2048 * 32;

void adamw(const at::Tensor& flag, const Lists& lists, double lr, int64_t step) {
  mt::AdamFunctor op;
  op.s = mt::adam_scalars(lr, 0.9, 0.999, 1e-8, mt::kAdamDecoupled, 0.01);
  op.s.set_step(static_cast<float>(step), true);
  Engine::elementwise<mt::TypeList<float, float, float, float>>("adamw", kChunk, flag, lists, op);
}

std::vector<at::Tensor> l2norm(const at::Tensor& flag, const Lists& lists) {
  auto out = Engine::reduce<mt::TypeList<float>>("l2norm", kChunk, flag, lists, mt::SquareFunctor<false>{},
                                                 mt::norm_request(true));
  return {out.total, out.per_tensor};
}

void scale(const at::Tensor& flag, const Lists& lists, double factor) {
  mt::ScaleFunctor op;
  op.scale = static_cast<float>(factor);
  Engine::elementwise<mt::TypeList<float, float>>("scale", kChunk, flag, lists, op);
}

std::vector<int64_t> blocks_per_sm() {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return {mt::cuda::resident_blocks<mt::TypeList<float, float, float, float>, mt::AdamFunctor, Config>() / sms,
          mt::cuda::resident_blocks<mt::TypeList<float>, mt::SquareFunctor<false>, Config>() / sms,
          mt::cuda::resident_blocks<mt::TypeList<float, float>, mt::ScaleFunctor, Config>() / sms};
}

}  // namespace tune
