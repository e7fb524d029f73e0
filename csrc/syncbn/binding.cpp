// syncbn: the dispatcher schemas (declared once, here) and NVIDIA apex's Python
// functions. Each Python function is a thin call into torch.ops.apex.syncbn_*, so
// the same name serves CPU and CUDA tensors.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/csrc/utils/pybind.h>

#include "syncbn_ops.h"

TORCH_LIBRARY_FRAGMENT(apex, m) {
  m.def("syncbn_welford_mean_var(Tensor input) -> (Tensor mean, Tensor var_biased)");
  m.def("syncbn_welford_mean_var_c_last(Tensor input) -> (Tensor mean, Tensor var_biased)");
  m.def("syncbn_welford_parallel(Tensor mean, Tensor var_biased, Tensor count, float eps)"
        " -> (Tensor mean, Tensor var, Tensor inv_std)");
  m.def("syncbn_batchnorm_forward(Tensor input, Tensor mean, Tensor inv_std, Tensor? weight, Tensor? shift)"
        " -> Tensor");
  m.def("syncbn_batchnorm_forward_c_last(Tensor input, Tensor? z, Tensor mean, Tensor inv_std, Tensor? weight,"
        " Tensor? shift, bool fuse_relu) -> Tensor");
  m.def("syncbn_reduce_bn(Tensor grad_output, Tensor input, Tensor mean, Tensor inv_std, Tensor? weight)"
        " -> (Tensor sum_dy, Tensor sum_dy_xmu, Tensor grad_weight, Tensor grad_bias)");
  m.def("syncbn_reduce_bn_c_last(Tensor grad_output, Tensor input, Tensor mean, Tensor inv_std, Tensor? weight)"
        " -> (Tensor sum_dy, Tensor sum_dy_xmu, Tensor grad_weight, Tensor grad_bias)");
  m.def("syncbn_batchnorm_backward(Tensor grad_output, Tensor input, Tensor mean, Tensor inv_std, Tensor? weight,"
        " Tensor sum_dy, Tensor sum_dy_xmu, Tensor count) -> Tensor");
  m.def("syncbn_batchnorm_backward_c_last(Tensor grad_output, Tensor input, Tensor mean, Tensor inv_std,"
        " Tensor? weight, Tensor sum_dy, Tensor sum_dy_xmu, Tensor count) -> Tensor");
  m.def("syncbn_relu_bw_c_last(Tensor grad_output, Tensor input, Tensor? z, Tensor mean, Tensor inv_std,"
        " Tensor? weight, Tensor? shift) -> Tensor");
}

namespace {

// A Python-callable forwarding to torch.ops.apex.<name>, with the exact signature of
// an implementation (pybind needs concrete argument types).
template <typename Signature>
struct PythonFunction;

template <typename Result, typename... Args>
struct PythonFunction<Result(Args...)> {
  static auto forward_to(const char* name) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Result(Args...)>();
    return [op](Args... args) -> Result { return op.call(args...); };
  }
};

using Ops = apex_syncbn::SyncBNOps<apex_syncbn::CpuKernels>;  // only for the signatures

}  // namespace

#define APEX_SYNCBN_PY(m, py_name, impl, doc) \
  m.def(py_name, PythonFunction<decltype(impl)>::forward_to("apex::syncbn_" py_name), doc)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "syncbn: Welford statistics and batch-norm kernels for apex.parallel.SyncBatchNorm";
  APEX_SYNCBN_PY(m, "welford_mean_var", Ops::welford_mean_var_nchw,
                 "(input [N, C, ...]) -> (mean [C], biased var [C]), fp32 (fp64 for fp64 input)");
  APEX_SYNCBN_PY(m, "welford_mean_var_c_last", Ops::welford_mean_var_c_last,
                 "(input [..., C]) -> (mean [C], biased var [C])");
  APEX_SYNCBN_PY(m, "welford_parallel", Ops::welford_parallel,
                 "(mean [W, C], var_biased [W, C], count [W], eps) -> (mean [C], unbiased var [C], inv_std [C])");
  APEX_SYNCBN_PY(m, "batchnorm_forward", Ops::batchnorm_forward_nchw,
                 "(input, mean, inv_std, weight?, shift?) -> (input - mean) * inv_std * weight + shift");
  APEX_SYNCBN_PY(m, "batchnorm_forward_c_last", Ops::batchnorm_forward_c_last,
                 "(input [..., C], z?, mean, inv_std, weight?, shift?, fuse_relu) -> normalized [+ z] [relu]");
  APEX_SYNCBN_PY(m, "reduce_bn", Ops::reduce_bn_nchw,
                 "(grad_output, input, mean, inv_std, weight?) -> (sum_dy, sum_dy_xmu, grad_weight, grad_bias)");
  APEX_SYNCBN_PY(m, "reduce_bn_c_last", Ops::reduce_bn_c_last,
                 "(grad_output, input [..., C], mean, inv_std, weight?) -> (sum_dy, sum_dy_xmu, grad_weight, grad_bias)");
  APEX_SYNCBN_PY(m, "batchnorm_backward", Ops::batchnorm_backward_nchw,
                 "(grad_output, input, mean, inv_std, weight?, sum_dy, sum_dy_xmu, count [W]) -> grad_input");
  APEX_SYNCBN_PY(m, "batchnorm_backward_c_last", Ops::batchnorm_backward_c_last,
                 "(grad_output, input [..., C], mean, inv_std, weight?, sum_dy, sum_dy_xmu, count [W]) -> grad_input");
  APEX_SYNCBN_PY(m, "relu_bw_c_last", Ops::relu_bw_c_last,
                 "(grad_output, input [..., C], z?, mean, inv_std, weight?, shift?) -> grad_output masked by the fused relu");
}
