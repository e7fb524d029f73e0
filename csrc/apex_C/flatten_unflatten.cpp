// apex_C: flatten a list of dense tensors into one contiguous 1-D buffer, and view
// such a buffer as tensors shaped like a list. DDP buckets and amp's combined
// gradients use them to turn many small collectives or kernels into one.
//
// The op is a concatenation, and ATen's cat is already the right kernel on every
// device, so a single composite implementation serves CPU, CUDA and the meta
// tensors torch.compile traces with (and autograd comes for free).
#include <ATen/ATen.h>
#include <torch/library.h>
#include <torch/csrc/utils/pybind.h>

#include "apex/check.h"

namespace {

void check_same_dense_kind(at::TensorList tensors, const char* op) {
  APEX_CHECK(!tensors.empty(), op, ": expected a non-empty list of tensors");
  const at::Tensor& first = tensors.front();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    APEX_CHECK(t.layout() == at::kStrided, op, ": tensor ", i, " is not dense");
    APEX_CHECK(t.scalar_type() == first.scalar_type(), op, ": all tensors must share one dtype, but tensor 0 is ",
               first.scalar_type(), " and tensor ", i, " is ", t.scalar_type());
    APEX_CHECK(t.device() == first.device(), op, ": all tensors must be on one device, but tensor 0 is on ",
               first.device(), " and tensor ", i, " is on ", t.device());
  }
}

at::Tensor flatten(at::TensorList tensors) {
  check_same_dense_kind(tensors, "apex_C.flatten");
  std::vector<at::Tensor> rows;
  rows.reserve(tensors.size());
  for (const auto& t : tensors) rows.push_back(t.reshape({-1}));
  return at::cat(rows);
}

std::vector<at::Tensor> unflatten(const at::Tensor& flat, at::TensorList like) {
  check_same_dense_kind(like, "apex_C.unflatten");
  APEX_CHECK(flat.dim() == 1, "apex_C.unflatten: flat must be 1-D, got ", flat.dim(), " dims");
  int64_t total = 0;
  for (const auto& t : like) total += t.numel();
  APEX_CHECK(flat.numel() == total, "apex_C.unflatten: flat has ", flat.numel(),
             " elements but the tensors to match hold ", total);
  std::vector<at::Tensor> views;
  views.reserve(like.size());
  int64_t offset = 0;
  for (const auto& t : like) {
    views.push_back(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
  return views;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(apex, m) {
  m.def("flatten(Tensor[] tensors) -> Tensor");
  m.def("unflatten(Tensor(a) flat, Tensor[] like) -> Tensor(a)[]");
}

TORCH_LIBRARY_IMPL(apex, CompositeImplicitAutograd, m) {
  m.impl("flatten", &flatten);
  m.impl("unflatten", &unflatten);
}

// NVIDIA apex's module-level functions, for code that calls apex_C directly.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "apex_C: flatten/unflatten of dense tensor lists (torch.ops.apex.flatten / unflatten)";
  // pybind converts Python lists to std::vector, not to ArrayRef.
  m.def("flatten", [](const std::vector<at::Tensor>& tensors) { return flatten(tensors); },
        "Concatenate dense tensors (one dtype, one device) into a 1-D tensor",
        pybind11::arg("tensors"));
  m.def("unflatten", [](const at::Tensor& flat, const std::vector<at::Tensor>& tensors) { return unflatten(flat, tensors); },
        "Views of a 1-D tensor shaped like each tensor of a list",
        pybind11::arg("flat"), pybind11::arg("tensors"));
}
