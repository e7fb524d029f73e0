#pragma once
// transducer: what the joint and loss CUDA units (transducer_joint_cuda.cu, transducer_loss_cuda.cu)
// share. They are two units so that ninja compiles them in parallel: each instantiates its kernels
// for every dtype, and together they were the op's slowest unit (benchmarks/build/NOTES.md).
//
// The CUDA kernels:
//  joint:  the forward's threads each own (b, t, 16-byte pack of H): f's pack stays in registers
//          while they walk u, storing h (and mask) one vector per step. The backward reads h_grad
//          once: each thread walks u for a few frames, keeping f_grad's sums over u in registers
//          and adding g_grad's sums over t in shared memory, in a fixed order (joint_backward_kernel).
//          A ReLU mask the forward did not store is recomputed there from f and g.
//  loss:   a group of lanes per lattice row (several rows a warp for short rows; a block per row
//          past 16 KiB, apex/row_softmax.cuh) computes the row's log-sum-exp in one pass over its
//          logits, loaded before use, and the log-probabilities of blank and label; a wavefront
//          kernel (one block per batch element and direction) runs alpha and beta over the
//          lattice's anti-diagonals, a thread per u passing values on through registers and shared
//          memory; the backward writes each row's gradient in one more pass. No softmax or
//          log-softmax tensor is ever stored.
#include "apex/cuda.cuh"
#include "apex/fast_exp2.cuh"
#include "apex/block_reduce.cuh"
#include "apex/occupancy.cuh"
#include "apex/row_softmax.cuh"
#include "transducer.h"
#include "transducer_math.h"

namespace apex::transducer {
namespace {

using namespace apex::cuda;

constexpr int kThreads = 256;  // joint kernels' and the loss row groups' blocks

// A vector's values as M. bfloat16 to float from its 32-bit words (value 2k: word k shifted up;
// 2k + 1: word k, low half cleared), which keeps the loaded words in their registers until used: the
// generic conversion had every 16-bit value unpacked into a register of its own ahead, doubling the
// registers a thread held (a loss row group's 120 -> 75).
template <class M, class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void convert(const AlignedVector<T, kVec>& v, M* out) {
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<M, float> && kVec % 2 == 0) {
    uint32_t words[kVec / 2];
    memcpy(words, &v, sizeof(words));
#pragma unroll
    for (int k = 0; k < kVec / 2; ++k) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[e] = static_cast<M>(v.value[e]);
  }
}

// launch(integral_constant<kVec>): 16-byte vectors where `width` and every pointer allow them, else scalars.
template <class T, class Launch>
void with_vector_width(int64_t width, std::initializer_list<const void*> pointers, Launch&& launch) {
  constexpr int kVec = vector_width<T>();
  bool aligned = width % kVec == 0;
  for (const void* p : pointers) aligned = aligned && (p == nullptr || is_aligned(p));
  if (aligned) {
    launch(std::integral_constant<int, kVec>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

}  // namespace
}  // namespace apex::transducer
