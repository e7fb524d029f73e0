#pragma once
// Where an op's kernel runs. Every op function is a template over one of these (see op.h), and
// every kernel is an overload taking one as its first argument:
//
//   void scale(const Cpu&, const ScaleArgs&);    // my_op_cpu.cpp
//   void scale(const Cuda&, const ScaleArgs&);   // my_op_cuda.cu
//
// Light on purpose: kernel sources (.cu above all) include this, not torch's headers, so they
// compile in seconds (a .cu including ATen/ATen.h takes ~35 s before its first kernel).

#include <cstdint>

namespace apex {

// The host: kernels use at::parallel_for over torch's threads.
struct Cpu {
  static constexpr bool kRuns = true;
};

// A CUDA (or ROCm) GPU: the kernel runs on `stream`, with `device` already current.
struct Cuda {
  static constexpr bool kRuns = true;
  void* stream = nullptr;  // the cudaStream_t (hipStream_t on ROCm) to launch on
  int device = 0;
};

// No device at all: the op function only checks its arguments and allocates its outputs.
// Registered as the op's Meta kernel, it is the shape function that torch.compile, torch.export
// and meta tensors use, and it can never disagree with the real kernels' argument checks.
struct Meta {
  static constexpr bool kRuns = false;
};

}  // namespace apex
