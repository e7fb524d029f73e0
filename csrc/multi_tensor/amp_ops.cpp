// amp_C's housekeeping ops (torch.ops.apex.*; `amp_C.<name>` is the same function taking NVIDIA
// apex's list of tensor lists): copies and unscales (multi_tensor_scale, multi_tensor_axpby),
// grad norms (multi_tensor_l2norm and its variants) and the loss-scale update with hysteresis.
// None of them is differentiated.
#include "apex/multi_tensor_op.h"
#include "l2norm.h"
#include "scale.h"
#include "update_scale_hysteresis.h"

namespace apex::multi_tensor {
namespace {

struct Scale {
  static constexpr const char* kSchema =
      "multi_tensor_scale(int chunk_size, Tensor(a!) noop_flag, Tensor[] inputs, Tensor(b!)[] outputs, float scale) "
      "-> ()";
  // out = in * scale for every tensor; an inf/nan input sets the flag.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList inputs, at::TensorList outputs,
                   double scale) {
    Lists lists("multi_tensor_scale", chunk_size, flag, {{inputs, "inputs"}, {outputs, "outputs", Access::kWrite}});
    ScaleFunctor op;
    op.scale = static_cast<float>(scale);
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      multi_tensor::scale(device, view, flag_data, op);
    });
  }
};

struct Axpby {
  static constexpr const char* kSchema =
      "multi_tensor_axpby(int chunk_size, Tensor(a!) noop_flag, Tensor[] x, Tensor[] y, Tensor(b!)[] out, float a, "
      "float b, int arg_to_check) -> ()";
  // out = a * x + b * y; arg_to_check (-1 both, 0 x, 1 y) picks the inputs checked for inf/nan.
  template <class Device>
  static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList x, at::TensorList y,
                   at::TensorList out, double a, double b, int64_t arg_to_check) {
    constexpr const char* kName = "multi_tensor_axpby";
    Lists lists(kName, chunk_size, flag, {{x, "x"}, {y, "y"}, {out, "out", Access::kWrite}});
    APEX_CHECK(arg_to_check >= -1 && arg_to_check <= 1, kName, ": arg_to_check must be -1, 0 or 1, got ",
               arg_to_check);
    AxpbyFunctor op;
    op.a = static_cast<float>(a);
    op.b = static_cast<float>(b);
    op.arg_to_check = static_cast<int>(arg_to_check);
    launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
      axpby(device, view, flag_data, op);
    });
  }
};

// (total norm float32 [1], per-tensor norms float32 [count] or [0]) of lists [x] or [in, out].
template <class Device>
std::tuple<at::Tensor, at::Tensor> norms(Lists& lists, const at::Tensor& flag, std::optional<bool> per_tensor,
                                         NormArgs args, const at::Tensor* scale) {
  const auto options = flag.options().dtype(at::kFloat);
  const bool each = per_tensor.value_or(false);
  at::Tensor total = at::empty({1}, options);
  at::Tensor per_tensor_norms = at::empty({each ? lists.count() : 0}, options);
  args.out.mode = each ? PerTensorOut::kWrite : PerTensorOut::kNone;
  launch_lists<Device>(lists, flag, [&](const auto& device, const TensorLists& view, int* flag_data) {
    std::vector<at::Tensor> keep;
    if (scale != nullptr) args.square.scale = scalar_arg(*scale, flag, keep);
    const at::Tensor scratch = reduction_buffer(device, flag, lists.count());
    args.out.total = total.mutable_data_ptr<float>();
    args.out.per_tensor = each ? per_tensor_norms.mutable_data_ptr<float>() : nullptr;
    args.out.scratch = scratch.mutable_data_ptr<float>();
    norm(device, view, flag_data, args);
  });
  return {total, per_tensor_norms};
}

// multi_tensor_l2norm (kSkip false) and multi_tensor_l2norm_mp (kSkip: nothing, norms 0, while
// the flag is set).
template <bool kSkip>
struct L2norm {
  static constexpr const char* kSchema =
      kSkip ? "multi_tensor_l2norm_mp(int chunk_size, Tensor(a!) noop_flag, Tensor[] tensors, bool? per_tensor=None) "
              "-> (Tensor, Tensor)"
            : "multi_tensor_l2norm(int chunk_size, Tensor(a!) noop_flag, Tensor[] tensors, bool? per_tensor=None) "
              "-> (Tensor, Tensor)";
  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(int64_t chunk_size, const at::Tensor& flag, at::TensorList tensors,
                                                 std::optional<bool> per_tensor) {
    Lists lists(kSkip ? "multi_tensor_l2norm_mp" : "multi_tensor_l2norm", chunk_size, flag, {{tensors, "tensors"}});
    NormArgs args;
    args.square.skip_flag = kSkip;
    args.out.zero_if_flag_set = kSkip;
    return norms<Device>(lists, flag, per_tensor, args, nullptr);
  }
};

struct L2normScale {
  static constexpr const char* kSchema =
      "multi_tensor_l2norm_scale(int chunk_size, Tensor(a!) noop_flag, Tensor[] inputs, Tensor(b!)[] outputs, "
      "float scale, bool? per_tensor=None) -> (Tensor, Tensor)";
  // The norms of the inputs, while writing out = in * scale.
  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(int64_t chunk_size, const at::Tensor& flag, at::TensorList inputs,
                                                 at::TensorList outputs, double scale,
                                                 std::optional<bool> per_tensor) {
    Lists lists("multi_tensor_l2norm_scale", chunk_size, flag,
                {{inputs, "inputs"}, {outputs, "outputs", Access::kWrite}});
    NormArgs args;
    args.square.scale = scalar_arg(scale);
    args.square.write_out = true;
    return norms<Device>(lists, flag, per_tensor, args, nullptr);
  }
};

struct UnscaleL2norm {
  static constexpr const char* kSchema =
      "multi_tensor_unscale_l2norm(int chunk_size, Tensor(a!) noop_flag, Tensor[] tensors, Tensor inv_scale, "
      "bool? per_tensor=None) -> (Tensor, Tensor)";
  // The norms of grads * inv_scale (the grads are left unchanged).
  template <class Device>
  static std::tuple<at::Tensor, at::Tensor> call(int64_t chunk_size, const at::Tensor& flag, at::TensorList tensors,
                                                 const at::Tensor& inv_scale, std::optional<bool> per_tensor) {
    constexpr const char* kName = "multi_tensor_unscale_l2norm";
    Lists lists(kName, chunk_size, flag, {{tensors, "tensors"}});
    check_scalar(kName, "inv_scale", inv_scale, flag);
    return norms<Device>(lists, flag, per_tensor, NormArgs{}, &inv_scale);
  }
};

struct UpdateScaleHysteresis {
  static constexpr const char* kSchema =
      "amp_update_scale_hysteresis(Tensor(a!) current_scale, Tensor(b!) growth_tracker, "
      "Tensor(c!) hysteresis_tracker, Tensor found_inf, float growth_factor, float backoff_factor, "
      "int growth_interval, int hysteresis) -> ()";
  // amp's dynamic loss scale with hysteresis (amp_C.update_scale_hysteresis returns current_scale).
  template <class Device>
  static void call(const at::Tensor& current_scale, const at::Tensor& growth_tracker,
                   const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf, double growth_factor,
                   double backoff_factor, int64_t growth_interval, int64_t hysteresis) {
    constexpr const char* kName = "update_scale_hysteresis";
    const std::pair<const at::Tensor*, const char*> expected[] = {
        {&current_scale, "current_scale"}, {&growth_tracker, "growth_tracker"},
        {&hysteresis_tracker, "hysteresis_tracker"}, {&found_inf, "found_inf"}};
    for (const auto& [tensor, what] : expected) {
      const bool is_int = tensor == &growth_tracker || tensor == &hysteresis_tracker;
      APEX_CHECK(tensor->sym_numel() == 1 && tensor->device() == current_scale.device(), kName, ": ", what,
                 " must be a one-element tensor on ", current_scale.device());
      APEX_CHECK(tensor->scalar_type() == (is_int ? at::kInt : at::kFloat), kName, ": ", what, " must be ",
                 is_int ? "int32" : "float32", ", got ", tensor->scalar_type());
    }
    APEX_CHECK(growth_interval > 0, kName, ": growth_interval must be positive, got ", growth_interval);
    launch<Device>(current_scale, [&](const auto& device) {
      update_scale_hysteresis(device, ScaleHysteresisUpdate{current_scale.mutable_data_ptr<float>(),
                                                            growth_tracker.mutable_data_ptr<int>(),
                                                            hysteresis_tracker.mutable_data_ptr<int>(),
                                                            found_inf.const_data_ptr<float>(), growth_factor,
                                                            backoff_factor, static_cast<int>(growth_interval),
                                                            static_cast<int>(hysteresis)});
    });
  }
};

}  // namespace

APEX_LIBRARY(m) {
  define_multi_tensor<Scale>(m);
  define_multi_tensor<Axpby>(m);
  define_multi_tensor<L2norm<false>>(m);
  define_multi_tensor<L2norm<true>>(m);
  define_multi_tensor<L2normScale>(m);
  define_multi_tensor<UnscaleL2norm>(m);
  define_multi_tensor<UpdateScaleHysteresis>(m);
}

}  // namespace apex::multi_tensor
