// transducer: what the joint's and the loss's op registrations (transducer_joint.cpp,
// transducer_loss.cpp) share: the lengths' checks and the kernels' lattice. Two units so that ninja
// compiles them in parallel: each op's registration instantiates its dispatcher and autograd
// wrappers, and in one unit they took 12.7 s on the 16-core build host.
#pragma once

#include <optional>
#include <vector>

#include "apex/autograd.h"
#include "transducer.h"

namespace apex::transducer {

inline bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// lengths / offsets: [B] integer tensors on `like`'s device.
inline void check_lengths(const at::Tensor& t, const c10::SymInt& batch, const at::Tensor& like, const char* op,
                          const char* what) {
  APEX_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", what,
             " must be int32 or int64, got ", t.scalar_type());
  APEX_CHECK(t.dim() == 1 && t.sym_size(0) == batch, op, ": ", what, " must have shape [", batch, "], got ",
             t.sym_sizes());
  check_same_device(t, like, op, what, "the data");
}

// The kernels' lattice over real tensors; `keep` holds the int64 copies the pointers refer to.
inline Lattice lattice_of(const at::Tensor& t_len, const at::Tensor& u_len,
                          const std::optional<at::Tensor>& batch_offset, int64_t max_t, int64_t max_u, int64_t rows,
                          std::vector<at::Tensor>& keep) {
  const auto as_long = [&](const at::Tensor& t) {
    keep.push_back(t.to(at::kLong).contiguous());
    return keep.back().const_data_ptr<int64_t>();
  };
  const int64_t* offsets = defined(batch_offset) ? as_long(*batch_offset) : nullptr;
  return {t_len.size(0), max_t, max_u, as_long(t_len), as_long(u_len), offsets, rows};
}

}  // namespace apex::transducer
