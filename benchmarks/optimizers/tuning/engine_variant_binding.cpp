// Python binding of one engine variant (engine_variant.cu); lists arrive as amp_C's do.
#include <torch/extension.h>

#include "engine_variant.h"
#include "tensor_lists_arg.h"

namespace {

using apex::multi_tensor::TensorListsArg;

tune::Lists lists_of(const TensorListsArg& arg) {
  tune::Lists lists;
  for (size_t l = 0; l < arg.size(); ++l) lists.push_back(arg[l]);
  return lists;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("adamw", [](const at::Tensor& flag, const TensorListsArg& lists, double lr, int64_t step) {
    tune::adamw(flag, lists_of(lists), lr, step);
  });
  m.def("l2norm", [](const at::Tensor& flag, const TensorListsArg& lists) {
    return tune::l2norm(flag, lists_of(lists));
  });
  m.def("scale", [](const at::Tensor& flag, const TensorListsArg& lists, double factor) {
    tune::scale(flag, lists_of(lists), factor);
  });
  m.def("blocks_per_sm", &tune::blocks_per_sm);
}
