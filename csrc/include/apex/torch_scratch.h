#pragma once
// The op side of apex/scratch.h: a Scratch answered from torch's caching allocator.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>

#include "apex/scratch.h"

namespace apex {

// Bytes on `like`'s device (its current stream's pool), held in `keep` until the caller drops it.
inline Scratch torch_scratch(const at::Tensor& like, at::Tensor& keep) {
  return [&like, &keep](size_t bytes) {
    keep = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
    return keep.mutable_data_ptr();
  };
}

}  // namespace apex
