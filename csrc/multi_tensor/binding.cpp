// amp_C: NVIDIA apex's Python functions (name, argument order, a list of tensor lists after
// the noop flag), each a thin wrapper over its torch.ops.apex op so one call serves CPU and
// CUDA tensors. The dispatcher ops take every list as its own Tensor[] argument.
#include <torch/extension.h>

#include "adagrad.h"
#include "adam.h"
#include "l2norm.h"
#include "lamb.h"
#include "novograd.h"
#include "scale.h"
#include "sgd.h"
#include "tensor_lists_arg.h"
#include "update_scale_hysteresis.h"

namespace apex::multi_tensor {
namespace {

using Tensor = at::Tensor;

// Stands in for an engine: only the signatures of the op templates are taken from it.
struct SignatureOf;

// Calls the dispatcher op apex::<name>, whose C++ signature is Sig.
template <class Sig, class... Args>
decltype(auto) call_op(const char* name, Args&&... args) {
  static_assert(std::is_function_v<Sig>);
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow((std::string("apex::") + name).c_str(), "")
      .typed<Sig>()
      .call(std::forward<Args>(args)...);
}

// The lists of apex's tensor_lists argument, checked to number one of `counts` and to hold
// no sparse tensor (the dispatcher would only say that the op has no sparse kernel); a missing
// optional trailing list comes back empty.
std::vector<at::TensorList> unpack(const char* name, const TensorListsArg& lists,
                                   std::initializer_list<size_t> counts) {
  bool ok = false;
  for (size_t c : counts) ok = ok || lists.size() == c;
  std::string expected;
  for (size_t c : counts) expected += (expected.empty() ? "" : " or ") + std::to_string(c);
  APEX_CHECK(ok, name, ": expected ", expected, " tensor lists, got ", lists.size());
  std::vector<at::TensorList> out(std::max(counts));
  for (size_t l = 0; l < lists.size(); ++l) {
    out[l] = lists[l];
    for (size_t t = 0; t < out[l].size(); ++t) {
      APEX_CHECK(out[l][t].layout() == at::kStrided, name, ": tensor ", t, " of list ", l,
                 " is sparse (sparse gradients are not supported)");
    }
  }
  return out;
}

}  // namespace
}  // namespace apex::multi_tensor

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace apex::multi_tensor;
  m.doc() = "apex multi-tensor kernels (fused optimizers, amp unscale, grad norms), CPU and CUDA";

  m.def("multi_tensor_scale", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists, double scale) {
    auto l = unpack("multi_tensor_scale", lists, {2});
    call_op<decltype(multi_tensor_scale<SignatureOf>)>("multi_tensor_scale", chunk, flag, l[0], l[1], scale);
  }, "out = in * scale for lists [in, out]; sets the flag on inf/nan inputs");
  m.def("multi_tensor_axpby", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists, double a, double b,
                                 int64_t arg_to_check) {
    auto l = unpack("multi_tensor_axpby", lists, {3});
    call_op<decltype(multi_tensor_axpby<SignatureOf>)>("multi_tensor_axpby", chunk, flag, l[0], l[1], l[2], a, b,
                                                       arg_to_check);
  }, "out = a * x + b * y for lists [x, y, out]; arg_to_check (-1 both, 0 x, 1 y) picks the inputs checked for inf/nan");

  auto def_norm = [&m](const char* name, auto signature, const char* doc) {
    using Sig = typename decltype(signature)::type;
    m.def(name, [name](int64_t chunk, const Tensor& flag, const TensorListsArg& lists, std::optional<bool> per_tensor) {
      auto l = unpack(name, lists, {1});
      return call_op<Sig>(name, chunk, flag, l[0], per_tensor);
    }, doc, pybind11::arg("chunk_size"), pybind11::arg("noop_flag"), pybind11::arg("tensor_lists"),
       pybind11::arg("per_tensor") = pybind11::none());
  };
  def_norm("multi_tensor_l2norm", TypeTag<decltype(multi_tensor_l2norm<SignatureOf>)>{},
           "(total_norm float32[1], per_tensor_norms float32[n] or [0]) of lists [tensors]");
  def_norm("multi_tensor_l2norm_mp", TypeTag<decltype(multi_tensor_l2norm_mp<SignatureOf>)>{},
           "multi_tensor_l2norm that does nothing (norms 0) while the flag is set");
  m.def("multi_tensor_l2norm_scale", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists, double scale,
                                        std::optional<bool> per_tensor) {
    auto l = unpack("multi_tensor_l2norm_scale", lists, {2});
    return call_op<decltype(multi_tensor_l2norm_scale<SignatureOf>)>("multi_tensor_l2norm_scale", chunk, flag, l[0],
                                                                      l[1], scale, per_tensor);
  }, "norms of lists [in, out] input while writing out = in * scale",
     pybind11::arg("chunk_size"), pybind11::arg("noop_flag"), pybind11::arg("tensor_lists"), pybind11::arg("scale"),
     pybind11::arg("per_tensor") = pybind11::none());
  m.def("multi_tensor_unscale_l2norm", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists,
                                          const Tensor& inv_scale, std::optional<bool> per_tensor) {
    auto l = unpack("multi_tensor_unscale_l2norm", lists, {1});
    return call_op<decltype(multi_tensor_unscale_l2norm<SignatureOf>)>("multi_tensor_unscale_l2norm", chunk, flag,
                                                                        l[0], inv_scale, per_tensor);
  }, "norms of grads * inv_scale (grads unchanged)",
     pybind11::arg("chunk_size"), pybind11::arg("noop_flag"), pybind11::arg("tensor_lists"),
     pybind11::arg("inv_scale"), pybind11::arg("per_tensor") = pybind11::none());

  m.def("multi_tensor_adam", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists, double lr, double beta1,
                                double beta2, double eps, int64_t step, int64_t mode, int64_t bias_correction,
                                double weight_decay) {
    auto l = unpack("multi_tensor_adam", lists, {4});
    call_op<decltype(multi_tensor_adam<SignatureOf>)>("multi_tensor_adam", chunk, flag, l[0], l[1], l[2], l[3], lr,
                                                      beta1, beta2, eps, step, mode, bias_correction, weight_decay);
  }, "Adam (mode 0) / AdamW (mode 1) step on lists [grads, params, exp_avgs, exp_avg_sqs]");
  m.def("multi_tensor_adam_capturable", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists,
                                           const Tensor& lr, double beta1, double beta2, double eps,
                                           const Tensor& step, int64_t mode, int64_t bias_correction,
                                           double weight_decay, const Tensor& inv_scale) {
    auto l = unpack("multi_tensor_adam_capturable", lists, {4});
    call_op<decltype(multi_tensor_adam_capturable<SignatureOf>)>("multi_tensor_adam_capturable", chunk, flag, l[0],
                                                                 l[1], l[2], l[3], lr, beta1, beta2, eps, step, mode,
                                                                 bias_correction, weight_decay, inv_scale);
  }, "graph-capturable Adam: lr/step/inv_scale are device tensors; skipped while the flag is set");
  m.def("multi_tensor_adam_capturable_master", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists,
                                                  const Tensor& lr, double beta1, double beta2, double eps,
                                                  const Tensor& step, int64_t mode, int64_t bias_correction,
                                                  double weight_decay, const Tensor& inv_scale) {
    auto l = unpack("multi_tensor_adam_capturable_master", lists, {5});
    call_op<decltype(multi_tensor_adam_capturable_master<SignatureOf>)>(
        "multi_tensor_adam_capturable_master", chunk, flag, l[0], l[1], l[2], l[3], l[4], lr, beta1, beta2, eps, step,
        mode, bias_correction, weight_decay, inv_scale);
  }, "capturable Adam on fp32 master params (5th list), copying them into the params");
  m.def("multi_tensor_sgd", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists, double weight_decay,
                               double momentum, double dampening, double lr, bool nesterov, bool first_run,
                               bool wd_after_momentum, double scale) {
    auto l = unpack("multi_tensor_sgd", lists, {3, 4});
    call_op<decltype(multi_tensor_sgd<SignatureOf>)>("multi_tensor_sgd", chunk, flag, l[0], l[1], l[2], l[3],
                                                     weight_decay, momentum, dampening, lr, nesterov, first_run,
                                                     wd_after_momentum, scale);
  }, "SGD step on lists [grads, weights, momentum(, weights_out)]; skipped while the flag is set");
  m.def("multi_tensor_lamb", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists, double lr, double beta1,
                                double beta2, double eps, int64_t step, int64_t bias_correction, double weight_decay,
                                int64_t grad_averaging, int64_t mode, const Tensor& global_grad_norm,
                                double max_grad_norm, std::optional<bool> use_nvlamb) {
    auto l = unpack("multi_tensor_lamb", lists, {4});
    call_op<decltype(multi_tensor_lamb<SignatureOf>)>("multi_tensor_lamb", chunk, flag, l[0], l[1], l[2], l[3], lr,
                                                      beta1, beta2, eps, step, bias_correction, weight_decay,
                                                      grad_averaging, mode, global_grad_norm, max_grad_norm,
                                                      use_nvlamb);
  }, "LAMB step on lists [grads, params, exp_avgs, exp_avg_sqs] (grads are overwritten with the update)",
     pybind11::arg("chunk_size"), pybind11::arg("noop_flag"), pybind11::arg("tensor_lists"), pybind11::arg("lr"),
     pybind11::arg("beta1"), pybind11::arg("beta2"), pybind11::arg("epsilon"), pybind11::arg("step"),
     pybind11::arg("bias_correction"), pybind11::arg("weight_decay"), pybind11::arg("grad_averaging"),
     pybind11::arg("mode"), pybind11::arg("global_grad_norm"), pybind11::arg("max_grad_norm"),
     pybind11::arg("use_nvlamb") = pybind11::none());
  m.def("multi_tensor_lamb_mp", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists, const Tensor& lr,
                                   double beta1, double beta2, double eps, const Tensor& step,
                                   int64_t bias_correction, double weight_decay, int64_t grad_averaging,
                                   int64_t mode, const Tensor& global_grad_norm, const Tensor& max_grad_norm,
                                   std::optional<bool> use_nvlamb, const Tensor& found_inf,
                                   const Tensor& inv_scale) {
    auto l = unpack("multi_tensor_lamb_mp", lists, {4, 5});
    call_op<decltype(multi_tensor_lamb_mp<SignatureOf>)>("multi_tensor_lamb_mp", chunk, flag, l[0], l[1], l[2], l[3],
                                                         l[4], lr, beta1, beta2, eps, step, bias_correction,
                                                         weight_decay, grad_averaging, mode, global_grad_norm,
                                                         max_grad_norm, use_nvlamb, found_inf, inv_scale);
  }, "mixed-precision LAMB on lists [grads, fp32 params, exp_avgs, exp_avg_sqs(, params_out)]; skipped when found_inf");
  m.def("multi_tensor_lamb_stage1_cuda", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists,
                                            const Tensor& per_tensor_decay, int64_t step, double beta1, double beta2,
                                            double eps, const Tensor& global_grad_norm, double max_global_grad_norm) {
    auto l = unpack("multi_tensor_lamb_stage1_cuda", lists, {5});
    call_op<decltype(multi_tensor_lamb_stage1<SignatureOf>)>("multi_tensor_lamb_stage1", chunk, flag, l[0], l[1],
                                                             l[2], l[3], l[4], per_tensor_decay, step, beta1, beta2,
                                                             eps, global_grad_norm, max_global_grad_norm);
  }, "LAMB stage 1 on lists [grads, params, exp_avgs, exp_avg_sqs, updates] (any device despite the name)");
  m.def("multi_tensor_lamb_stage2_cuda", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists,
                                            const Tensor& param_norms, const Tensor& update_norms, double lr,
                                            double weight_decay, std::optional<bool> use_nvlamb) {
    auto l = unpack("multi_tensor_lamb_stage2_cuda", lists, {2});
    call_op<decltype(multi_tensor_lamb_stage2<SignatureOf>)>("multi_tensor_lamb_stage2", chunk, flag, l[0], l[1],
                                                             param_norms, update_norms, lr, weight_decay, use_nvlamb);
  }, "LAMB stage 2 on lists [params, updates] (any device despite the name)",
     pybind11::arg("chunk_size"), pybind11::arg("noop_flag"), pybind11::arg("tensor_lists"),
     pybind11::arg("per_tensor_param_norm"), pybind11::arg("per_tensor_update_norm"), pybind11::arg("lr"),
     pybind11::arg("weight_decay"), pybind11::arg("use_nvlamb") = pybind11::none());
  m.def("multi_tensor_novograd", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists,
                                    const Tensor& grad_norms, double lr, double beta1, double beta2, double eps,
                                    int64_t step, int64_t bias_correction, double weight_decay,
                                    int64_t grad_averaging, int64_t mode, int64_t norm_type) {
    auto l = unpack("multi_tensor_novograd", lists, {3});
    call_op<decltype(multi_tensor_novograd<SignatureOf>)>("multi_tensor_novograd", chunk, flag, l[0], l[1], l[2],
                                                          grad_norms, lr, beta1, beta2, eps, step, bias_correction,
                                                          weight_decay, grad_averaging, mode, norm_type);
  }, "NovoGrad step on lists [grads, params, exp_avgs]; grad_norms (float32 [n]) blended in place");
  m.def("multi_tensor_adagrad", [](int64_t chunk, const Tensor& flag, const TensorListsArg& lists, double lr,
                                   double eps, int64_t mode, double weight_decay) {
    auto l = unpack("multi_tensor_adagrad", lists, {3});
    call_op<decltype(multi_tensor_adagrad<SignatureOf>)>("multi_tensor_adagrad", chunk, flag, l[0], l[1], l[2], lr,
                                                         eps, mode, weight_decay);
  }, "Adagrad step on lists [grads, params, state_sums]");
  m.def("update_scale_hysteresis", [](const Tensor& current_scale, const Tensor& growth_tracker,
                                      const Tensor& hysteresis_tracker, const Tensor& found_inf, double growth_factor,
                                      double backoff_factor, int64_t growth_interval, int64_t hysteresis) {
    call_op<decltype(amp_update_scale_hysteresis<SignatureOf>)>("amp_update_scale_hysteresis", current_scale,
                                                                growth_tracker, hysteresis_tracker, found_inf,
                                                                growth_factor, backoff_factor, growth_interval,
                                                                hysteresis);
    return current_scale;
  }, "amp loss-scale update with hysteresis; returns current_scale (updated in place)");
}
