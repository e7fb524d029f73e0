// apex_C: flatten a list of dense tensors into one contiguous 1-D buffer, and view such a buffer as
// tensors shaped like a list. DDP buckets and amp's combined gradients use them to turn many small
// collectives or kernels into one.
//
// Both ops are compositions of ATen ops (cat, narrow, view), so they are registered as
// CompositeImplicitAutograd: one implementation runs on every device, differentiates through those
// ops, and traces as them under torch.compile (symbolic sizes included). No kernel of their own.
#include <ATen/ops/cat.h>

#include <vector>

#include "apex/op.h"

namespace apex::apex_C {
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

// torch.ops.apex.apex_C_flatten(tensors): their elements, in order (each in its logical order), as one
// contiguous 1-D tensor of their dtype, on their device.
struct Flatten {
  static constexpr const char* kSchema = "apex_C_flatten(Tensor[] tensors) -> Tensor";

  static at::Tensor call(at::TensorList tensors) {
    check_same_dense_kind(tensors, "apex_C.flatten");
    std::vector<at::Tensor> rows;
    rows.reserve(tensors.size());
    for (const auto& t : tensors) rows.push_back(t.reshape_symint({t.sym_numel()}));
    return at::cat(rows);
  }
};

// torch.ops.apex.apex_C_unflatten(flat, like): views of the 1-D `flat`, one per tensor of `like`, of
// its shape (flat's dtype and device), in order; flat must hold exactly their elements.
struct Unflatten {
  static constexpr const char* kSchema = "apex_C_unflatten(Tensor(a) flat, Tensor[] like) -> Tensor(a)[]";

  static std::vector<at::Tensor> call(const at::Tensor& flat, at::TensorList like) {
    check_same_dense_kind(like, "apex_C.unflatten");
    APEX_CHECK(flat.dim() == 1, "apex_C.unflatten: flat must be 1-D, got ", flat.dim(), " dims");
    c10::SymInt total = 0;
    for (const auto& t : like) total += t.sym_numel();
    APEX_CHECK(flat.sym_numel().sym_eq(total), "apex_C.unflatten: flat has ", flat.sym_numel(),
               " elements but the tensors to match hold ", total);
    std::vector<at::Tensor> views;
    views.reserve(like.size());
    c10::SymInt offset = 0;
    for (const auto& t : like) {
      views.push_back(flat.narrow_symint(0, offset, t.sym_numel()).view_symint(t.sym_sizes()));
      offset += t.sym_numel();
    }
    return views;
  }
};

}  // namespace

APEX_LIBRARY(m) {
  define_composite<Flatten>(m);
  define_composite<Unflatten>(m);
}

}  // namespace apex::apex_C
