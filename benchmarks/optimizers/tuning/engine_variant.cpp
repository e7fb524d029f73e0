// The ops of one engine variant, torch.ops.apex.<TUNE_NAME>_{adamw,l2norm,scale,blocks_per_sm}
// (TUNE_NAME defined by tune_engine.py, one library per variant). GPU only: tuning is about the
// CUDA kernels.
#include "apex/multi_tensor_op.h"
#include "engine_variant.h"

#define TUNE_STRING2(x) #x
#define TUNE_STRING(x) TUNE_STRING2(x)
#define TUNE_SCHEMA(rest) TUNE_STRING(TUNE_NAME) rest

namespace tune {
namespace {

namespace mt = apex::multi_tensor;
using apex::launch;

constexpr int64_t kChunk = 2048 * 32;

// Runs kernel(device, view, flag) on the GPU; refuses CPU tensors.
template <class Device, class Kernel>
void on_gpu(mt::Lists& lists, const at::Tensor& flag, Kernel&& kernel) {
  mt::launch_lists<Device>(lists, flag, [&](const auto& device, const mt::TensorLists& view, int* flag_data) {
    if constexpr (std::is_same_v<std::decay_t<decltype(device)>, apex::Cuda>) {
      kernel(device, view, flag_data);
    } else {
      APEX_CHECK(false, TUNE_STRING(TUNE_NAME), ": engine variants run on CUDA tensors only");
    }
  });
}

struct Adamw {
  static constexpr const char* kSchema = TUNE_SCHEMA(
      "_adamw(Tensor(a!) flag, Tensor[] grads, Tensor(b!)[] params, Tensor(c!)[] exp_avgs, "
      "Tensor(d!)[] exp_avg_sqs, float lr, int step) -> ()");
  // AdamW, betas 0.9/0.999, eps 1e-8, weight decay 0.01, fp32 lists.
  template <class Device>
  static void call(const at::Tensor& flag, at::TensorList g, at::TensorList p, at::TensorList m, at::TensorList v,
                   double lr, int64_t step) {
    mt::Lists lists("adamw", kChunk, flag,
                    {{g, "grads"}, {p, "params", mt::Access::kReadWrite}, {m, "exp_avgs", mt::Access::kReadWrite},
                     {v, "exp_avg_sqs", mt::Access::kReadWrite}});
    mt::AdamFunctor op;
    op.a.weight_decay = 0.01f;
    op.a.lr = mt::scalar_arg(lr);
    op.a.step = mt::scalar_arg(static_cast<double>(step));
    on_gpu<Device>(lists, flag, [&](const auto& device, const mt::TensorLists& view, int* f) {
      adamw(device, view, f, op);
    });
  }
};

struct L2norm {
  static constexpr const char* kSchema = TUNE_SCHEMA("_l2norm(Tensor(a!) flag, Tensor[] tensors) -> (Tensor, Tensor)");
  // (total L2 norm, per-tensor L2 norms) of fp32 tensors.
  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(const at::Tensor& flag, at::TensorList tensors) {
    mt::Lists lists("l2norm", kChunk, flag, {{tensors, "tensors"}});
    at::Tensor total = at::empty({1}, flag.options().dtype(at::kFloat));
    at::Tensor per_tensor = at::empty({lists.count()}, flag.options().dtype(at::kFloat));
    on_gpu<Device>(lists, flag, [&](const auto& device, const mt::TensorLists& view, int* f) {
      const at::Tensor work = at::empty({scratch(device, lists.count())}, flag.options().dtype(at::kFloat));
      mt::NormArgs args;
      args.out = {total.mutable_data_ptr<float>(), per_tensor.mutable_data_ptr<float>(),
                  work.mutable_data_ptr<float>(), mt::PerTensorOut::kWrite};
      l2norm(device, view, f, args);
    });
    return {total, per_tensor};
  }
};

struct Scale {
  static constexpr const char* kSchema = TUNE_SCHEMA(
      "_scale(Tensor(a!) flag, Tensor[] inputs, Tensor(b!)[] outputs, float factor) -> ()");
  // out = in * factor over fp32 tensors, flagging inf/nan inputs.
  template <class Device>
  static void call(const at::Tensor& flag, at::TensorList inputs, at::TensorList outputs, double factor) {
    mt::Lists lists("scale", kChunk, flag, {{inputs, "inputs"}, {outputs, "outputs", mt::Access::kWrite}});
    mt::ScaleFunctor op;
    op.scale = static_cast<float>(factor);
    on_gpu<Device>(lists, flag, [&](const auto& device, const mt::TensorLists& view, int* f) {
      scale(device, view, f, op);
    });
  }
};

struct BlocksPerSm {
  static constexpr const char* kSchema = TUNE_SCHEMA("_blocks_per_sm(Tensor on) -> int[]");
  // Resident blocks per SM of the adamw, l2norm and scale kernels on `on`'s GPU.
  template <class Device>
  static std::vector<int64_t> call(const at::Tensor& on) {
    std::vector<int64_t> blocks;
    launch<Device>(on, [&](const auto& device) {
      if constexpr (std::is_same_v<std::decay_t<decltype(device)>, apex::Cuda>) blocks = blocks_per_sm(device);
    });
    return blocks;
  }
};

}  // namespace

APEX_LIBRARY(m) {
  apex::define<Adamw>(m, apex::Autograd::kNever);
  apex::define<L2norm>(m, apex::Autograd::kNever);
  apex::define<Scale>(m, apex::Autograd::kNever);
  apex::define<BlocksPerSm>(m, apex::Autograd::kNever);
}

}  // namespace tune
