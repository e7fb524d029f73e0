// Dispatcher schemas of the amp_C ops (torch.ops.apex.multi_tensor_*). apex passes a list of
// tensor lists; a schema cannot take Tensor[][], so each list is its own Tensor[] argument.
// Lists a kernel writes are annotated (!) so torch.compile functionalizes them.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(apex, m) {
  m.def("multi_tensor_scale(int chunk_size, Tensor(a!) noop_flag, Tensor[] inputs, Tensor(b!)[] outputs, "
        "float scale) -> ()");
  m.def("multi_tensor_axpby(int chunk_size, Tensor(a!) noop_flag, Tensor[] x, Tensor[] y, Tensor(b!)[] out, "
        "float a, float b, int arg_to_check) -> ()");
  m.def("multi_tensor_l2norm(int chunk_size, Tensor(a!) noop_flag, Tensor[] tensors, bool? per_tensor=None) "
        "-> (Tensor, Tensor)");
  m.def("multi_tensor_l2norm_mp(int chunk_size, Tensor(a!) noop_flag, Tensor[] tensors, bool? per_tensor=None) "
        "-> (Tensor, Tensor)");
  m.def("multi_tensor_l2norm_scale(int chunk_size, Tensor(a!) noop_flag, Tensor[] inputs, Tensor(b!)[] outputs, "
        "float scale, bool? per_tensor=None) -> (Tensor, Tensor)");
  m.def("multi_tensor_unscale_l2norm(int chunk_size, Tensor(a!) noop_flag, Tensor[] tensors, Tensor inv_scale, "
        "bool? per_tensor=None) -> (Tensor, Tensor)");
  m.def("multi_tensor_adam(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
        "Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, float lr, float beta1, float beta2, float epsilon, "
        "int step, int mode, int bias_correction, float weight_decay) -> ()");
  m.def("multi_tensor_adam_capturable(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, "
        "Tensor(c!)[] params, Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, Tensor lr, float beta1, "
        "float beta2, float epsilon, Tensor step, int mode, int bias_correction, float weight_decay, "
        "Tensor inv_scale) -> ()");
  m.def("multi_tensor_adam_capturable_master(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, "
        "Tensor(c!)[] params, Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, Tensor(f!)[] master_params, "
        "Tensor lr, float beta1, float beta2, float epsilon, Tensor step, int mode, int bias_correction, "
        "float weight_decay, Tensor inv_scale) -> ()");
  m.def("multi_tensor_sgd(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] weights, "
        "Tensor(c!)[] momentum_buffers, Tensor(d!)[] weights_out, float weight_decay, float momentum, "
        "float dampening, float lr, bool nesterov, bool first_run, bool weight_decay_after_momentum, "
        "float scale) -> ()");
  m.def("multi_tensor_lamb(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, Tensor(c!)[] params, "
        "Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, float lr, float beta1, float beta2, float epsilon, "
        "int step, int bias_correction, float weight_decay, int grad_averaging, int mode, Tensor global_grad_norm, "
        "float max_grad_norm, bool? use_nvlamb=None) -> ()");
  m.def("multi_tensor_lamb_mp(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] grads, Tensor(c!)[] params, "
        "Tensor(d!)[] exp_avgs, Tensor(e!)[] exp_avg_sqs, Tensor(f!)[] params_out, Tensor lr, float beta1, "
        "float beta2, float epsilon, Tensor step, int bias_correction, float weight_decay, int grad_averaging, "
        "int mode, Tensor global_grad_norm, Tensor max_grad_norm, bool? use_nvlamb, Tensor found_inf, "
        "Tensor inv_scale) -> ()");
  m.def("multi_tensor_lamb_stage1(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor[] params, "
        "Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] updates, Tensor per_tensor_decay, int step, "
        "float beta1, float beta2, float epsilon, Tensor global_grad_norm, float max_global_grad_norm) -> ()");
  m.def("multi_tensor_lamb_stage2(int chunk_size, Tensor(a!) noop_flag, Tensor(b!)[] params, Tensor[] updates, "
        "Tensor per_tensor_param_norm, Tensor per_tensor_update_norm, float lr, float weight_decay, "
        "bool? use_nvlamb=None) -> ()");
  m.def("multi_tensor_novograd(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
        "Tensor(c!)[] exp_avgs, Tensor(d!) grad_norms, float lr, float beta1, float beta2, float epsilon, int step, "
        "int bias_correction, float weight_decay, int grad_averaging, int mode, int norm_type) -> ()");
  m.def("multi_tensor_adagrad(int chunk_size, Tensor(a!) noop_flag, Tensor[] grads, Tensor(b!)[] params, "
        "Tensor(c!)[] state_sums, float lr, float epsilon, int mode, float weight_decay) -> ()");
  m.def("amp_update_scale_hysteresis(Tensor(a!) current_scale, Tensor(b!) growth_tracker, "
        "Tensor(c!) hysteresis_tracker, Tensor found_inf, float growth_factor, float backoff_factor, "
        "int growth_interval, int hysteresis) -> ()");
}

// None of these ops is differentiated (they are optimizer steps and grad housekeeping, as in
// apex, where they bypass autograd entirely). Without a kernel for the Autograd key the
// dispatcher runs its boxed not-implemented fallback whenever an argument requires grad (model
// params do): it boxes every tensor of every list (measured on a small CPU: +180 us for the two
// 289-tensor lists of a scale call). A fallthrough goes straight to the CPU/CUDA kernel.
TORCH_LIBRARY_IMPL(apex, Autograd, m) {
  for (const char* name :
       {"multi_tensor_scale", "multi_tensor_axpby", "multi_tensor_l2norm", "multi_tensor_l2norm_mp",
        "multi_tensor_l2norm_scale", "multi_tensor_unscale_l2norm", "multi_tensor_adam", "multi_tensor_adam_capturable",
        "multi_tensor_adam_capturable_master", "multi_tensor_sgd", "multi_tensor_lamb", "multi_tensor_lamb_mp",
        "multi_tensor_lamb_stage1", "multi_tensor_lamb_stage2", "multi_tensor_novograd", "multi_tensor_adagrad",
        "amp_update_scale_hysteresis"}) {
    m.impl(name, torch::CppFunction::makeFallthrough());
  }
}
