#pragma once
// index_mul_2d: out[r, :] = in1[index[r], :] * in2[r, :] for in1 [sources, features], in2 and out
// [rows, features], with its backward and double backward. What the kernels take and the kernels.
//
// Per row r with s = index[r] (negative s counts from the end, as torch indexing does):
//   forward:          out[r]         = in1[s] * in2[r]
//   backward:         grad_in2[r]    = grad_out[r] * in1[s];        grad_in1[s] += grad_out[r] * in2[r]
//   double backward:  grad_grad_out[r] = gg1[s] * in2[r] + in1[s] * gg2[r]
//                     grad_in2[r]    = gg1[s] * grad_out[r];        grad_in1[s] += gg2[r] * grad_out[r]
// An index outside [-sources, sources) makes its row's outputs NaN and adds nothing to grad_in1
// (checking it on the host would need a device sync).
//
// grad_in1's sums are taken in float (double for float64 data) and rounded once, in an order that
// depends only on the index (and, on CUDA, on the GPU model): the same bits every run.
#include "apex/device.h"
#include "apex/dtype.h"
#include "apex/scratch.h"

namespace apex::index_mul_2d {

enum class Pass : int8_t { kForward, kBackward, kDoubleBackward };

struct Args {
  int64_t rows;
  int64_t sources;
  int64_t features;
  Dtype dtype;                  // of every data tensor; all contiguous
  const int64_t* index;         // [rows]
  const void* in1;              // [sources, features]
  const void* in2;              // [rows, features]
  const void* grad_out;         // [rows, features]: backward passes
  const void* grad_grad_in1;    // [sources, features] or null (zero): double backward
  const void* grad_grad_in2;    // [rows, features] or null (zero): double backward
  void* out;                    // forward: out; backward: grad_in2; double backward: grad_grad_out
  void* out2;                   // double backward: grad_in2
  void* grad_in1;               // backward passes: [sources, features], zeroed by the caller; the pass
                                // writes the sums of the rows that index each source into it
};

// `scratch` gives the working memory a pass needs (the CPU's float accumulator of 16-bit data, the
// GPU's sorted index and partial sums).
void index_mul(const Cpu&, Pass pass, const Args& args, const Scratch& scratch);   // index_mul_2d_cpu.cpp
void index_mul(const Cuda&, Pass pass, const Args& args, const Scratch& scratch);  // index_mul_2d_cuda.cu

}  // namespace apex::index_mul_2d
