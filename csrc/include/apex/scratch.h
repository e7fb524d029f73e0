#pragma once
// Scratch memory a kernel asks its op function for, when only the kernel's launch planning knows how
// much it needs (partial sums sized by the grid it picks from occupancy):
//
//   void reduce(const Cuda& device, const ReduceArgs& args, const Scratch& scratch);   // kernel side
//   float* partials = static_cast<float*>(scratch(bytes));
//
// The op function answers from torch's caching allocator (apex/torch_scratch.h), on the kernel's
// device and stream, and keeps the memory alive until the kernels queued by the call have run
// (freeing it after they are queued is enough: the allocator reuses it in stream order):
//
//   at::Tensor memory;                                                                   // op side
//   reduce(device, args, torch_scratch(input, memory));
#include <cstddef>
#include <functional>

namespace apex {

using Scratch = std::function<void*(size_t bytes)>;

}  // namespace apex
