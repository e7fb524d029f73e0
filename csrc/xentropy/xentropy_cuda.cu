// xentropy: CUDA kernels. One block per row (blocks loop over rows), each a single pass over the
// row's logits in 16-byte vectors. bfloat16 / float16 logits take xentropy_16bit.cuh's kernels
// (ex2.approx, packed 16-bit max: ~5.5 SASS instructions an element against ~15 here; 95-96% of
// copy bandwidth fwd+bwd on an H200, from 86-89%); float32 / float64 take the generic ones below
// (apex/row_softmax.cuh):
//  forward:  online softmax statistics (running max, sum of exp(x - max), sum of x), merged over
//            the block; writes only the row's loss and log-sum-exp. Nothing of the row is kept on
//            chip, so 256K classes run like 32K ones.
//  backward: reads the row once more and writes its gradient, exp(x - lse) recomputed per element.
#include <cmath>
#include <limits>

#include "apex/cuda.cuh"
#include "apex/block_reduce.cuh"
#include "apex/row_softmax.cuh"
#include "xentropy.h"
#include "xentropy_16bit.cuh"
#include "xentropy_math.h"

namespace apex::xentropy {
namespace {

using namespace apex::cuda;

constexpr int kMaxThreads = 256;
// A row is never spread over fewer threads than this: two warps (one ROCm wavefront).
constexpr int kMinThreads = 64;
// 16-byte loads each thread issues before using any: with 4+ resident blocks per SM this keeps
// >= 64 KB per SM in flight, what HBM3 needs to reach copy bandwidth.
constexpr int kUnroll = 4;
// Resident blocks per SM the register budget must allow (__launch_bounds__): 4 x 256 threads.
constexpr int kMinBlocksPerSm = 4;

template <class T, class Acc, int kVec>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocksPerSm) forward_kernel(ForwardArgs args) {
  __shared__ Online<Acc> scratch[kMaxThreads / C10_WARP_SIZE];
  const T* logits = static_cast<const T*>(args.logits.data);
  const int64_t classes = args.logits.classes;
  Acc* losses = static_cast<Acc*>(args.losses);
  Acc* lses = static_cast<Acc*>(args.max_log_sum_exp);
  for (int64_t row = blockIdx.x; row < args.logits.rows; row += gridDim.x) {
    const int64_t label = args.labels[row];
    const Label kind = classify(label, args.ignore_index, classes);
    if (kind == Label::kIgnored) {  // block-uniform: the row is never read
      if (threadIdx.x == 0) losses[row] = lses[row] = Acc(0);
      continue;
    }
    const T* x = logits + row * args.logits.row_stride;
    const Online<Acc> state = row_statistics<kUnroll, kVec>(x, classes, scratch);
    if (threadIdx.x == 0) {
      const Acc lse = state.log_sum_exp();
      lses[row] = lse;
      losses[row] = kind == Label::kValid
                        ? row_loss(lse, static_cast<Acc>(x[label]), state.sum, classes, args.smoothing)
                        : quiet_nan<Acc>();
    }
  }
}

template <class T, class Acc, int kVec>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocksPerSm) backward_kernel(BackwardArgs args) {
  const T* logits = static_cast<const T*>(args.logits.data);
  const int64_t classes = args.logits.classes;
  const Acc* grad_loss = static_cast<const Acc*>(args.grad_loss);
  const Acc* lses = static_cast<const Acc*>(args.max_log_sum_exp);
  T* grad_logits = static_cast<T*>(args.grad_logits);
  for (int64_t row = blockIdx.x; row < args.logits.rows; row += gridDim.x) {
    const int64_t label = args.labels[row];
    const Label kind = classify(label, args.ignore_index, classes);
    const T* x = logits + row * args.logits.row_stride;
    T* out = grad_logits + row * classes;  // the host made x and out equally aligned (or kVec == 1)
    if (kind == Label::kIgnored) {  // block-uniform: zeros, the row is never read
      zero_row<kVec>(out, classes);
      continue;
    }
    const Acc g = kind == Label::kValid ? grad_loss[row * args.grad_stride] : quiet_nan<Acc>();
    const GradTerms<Acc> terms = grad_terms(g, classes, args.smoothing);
    // Every class but the label's: g * p - uniform; the label's element is corrected below.
    const RowSplit split = write_scaled_softmax<kUnroll, kVec>(x, out, classes, lses[row], g, terms.uniform);
    // The thread that wrote the label's element rewrites it (program order: no race, no barrier),
    // from the logit again: one rounding to T, as for every other element.
    if (kind == Label::kValid && threadIdx.x == split.owner(label)) {
      const Acc p = exp2_of((static_cast<Acc>(x[label]) - lses[row]) * kLog2e<Acc>);
      out[label] = static_cast<T>(g * p - terms.uniform - terms.target);
    }
  }
}

template <class T>
unsigned threads_for(int64_t classes) {
  return row_threads<T>(classes, kUnroll, kMinThreads, kMaxThreads);
}

unsigned blocks_for(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, std::numeric_limits<int32_t>::max()));
}

}  // namespace

void forward(const Cuda& device, const ForwardArgs& args) {
  if (args.logits.rows == 0) return;
  dispatch_floating(args.logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const unsigned blocks = blocks_for(args.logits.rows);
    if constexpr (sizeof(T) == 2) {
      const unsigned threads = row_threads<T>(args.logits.classes, bits16::kForwardUnroll, bits16::kMinThreads,
                                              bits16::kMaxThreads);
      bits16::forward_kernel<T><<<blocks, threads, 0, cuda::stream(device)>>>(args);
    } else {
      forward_kernel<T, acc_type<T>, vector_width<T>()>
          <<<blocks, threads_for<T>(args.logits.classes), 0, cuda::stream(device)>>>(args);
    }
  });
  cuda::check_launch("xentropy_forward");
}

void backward(const Cuda& device, const BackwardArgs& args) {
  if (args.logits.rows == 0) return;
  dispatch_floating(args.logits.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vector_width<T>();
    // Vector accesses need every row of the logits and of the gradient to sit at the same offset
    // from a 16-byte boundary: equally aligned bases, and a row stride that keeps them so.
    const auto offset = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kVectorBytes; };
    const bool same_alignment =
        offset(args.logits.data) == offset(args.grad_logits) &&
        (args.logits.row_stride - args.logits.classes) * static_cast<int64_t>(sizeof(T)) % kVectorBytes == 0;
    const unsigned blocks = blocks_for(args.logits.rows), threads = threads_for<T>(args.logits.classes);
    if (!same_alignment) {  // any dtype: one element an access
      backward_kernel<T, acc_type<T>, 1><<<blocks, threads, 0, cuda::stream(device)>>>(args);
    } else if constexpr (sizeof(T) == 2) {
      const unsigned packed_threads = row_threads<T>(args.logits.classes, bits16::kBackwardUnroll,
                                                     bits16::kMinThreads, bits16::kMaxThreads);
      bits16::backward_kernel<T><<<blocks, packed_threads, 0, cuda::stream(device)>>>(args);
    } else {
      backward_kernel<T, acc_type<T>, kVec><<<blocks, threads, 0, cuda::stream(device)>>>(args);
    }
  });
  cuda::check_launch("xentropy_backward");
}

}  // namespace apex::xentropy
