// transducer: CUDA kernels.
//  joint:  a 2-D grid over [rows, packs of H] (apex/row_grid.cuh); backward sums h_grad over u (for
//          f_grad) and over t (for g_grad), each a pass over the valid lattice cells only.
//  loss:   one block per lattice row computes the row's log-sum-exp in one pass over its logits
//          (apex/row_softmax.cuh) and the log-probabilities of blank and label; a wavefront kernel
//          (one block per batch element and direction) runs alpha and beta over the lattice's
//          anti-diagonals; the backward writes each row's gradient in one more pass. No softmax or
//          log-softmax tensor is ever stored.
#include "apex/cuda.cuh"
#include "apex/block_reduce.cuh"
#include "apex/row_grid.cuh"
#include "apex/row_softmax.cuh"
#include "transducer.h"
#include "transducer_math.h"

namespace apex::transducer {
namespace {

using namespace apex::cuda;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;
constexpr int kRowUnroll = 4;          // 16-byte loads in flight per thread over a logits row
constexpr int kMinRowThreads = 64;
constexpr int kMaxRowThreads = 256;
constexpr int kMaxWavefrontThreads = 1024;

// ---- joint ---------------------------------------------------------------------------------

template <class T, int kVec>
__global__ void __launch_bounds__(kThreads) joint_forward_kernel(JointArgs a) {
  const T* f = static_cast<const T*>(a.f);
  const T* g = static_cast<const T*>(a.g);
  T* h = static_cast<T*>(a.h);
  const Lattice& l = a.lattice;
  const int64_t packs = a.width / kVec;
  for_each_row(l.rows, [&](int64_t row) {
    const Cell c = cell_of(l, row);
    for_each_pack(packs, [&](int64_t pack) {
      const int64_t at = row * a.width + pack * kVec;
      AlignedVector<T, kVec> out;
      AlignedVector<uint8_t, kVec> passed;
      if (!c.valid) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) out.value[k] = T(-1), passed.value[k] = 0;
      } else {
        const auto fv = load_vector<kVec>(f, (c.b * l.max_t + c.t) * a.width + pack * kVec);
        const auto gv = load_vector<kVec>(g, (c.b * l.max_u + c.u) * a.width + pack * kVec);
        AlignedVector<bool, kVec> keep;
        if (a.keep != nullptr) keep = load_vector<kVec>(a.keep, at);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          float v = static_cast<float>(fv.value[k]) + static_cast<float>(gv.value[k]);
          bool pass = !(a.relu && v <= 0.0f);
          if (a.keep != nullptr) pass = pass && keep.value[k];
          v = pass ? (a.keep != nullptr ? v * a.scale : v) : 0.0f;
          out.value[k] = static_cast<T>(v);
          passed.value[k] = pass;
        }
      }
      store_vector<kVec>(h, at, out);
      if (a.mask != nullptr) store_vector<kVec>(a.mask, at, passed);
    });
  });
}

// f_grad (kOverT = false: rows (b, t), summing over u) or g_grad (kOverT: rows (b, u), over t).
template <class T, int kVec, bool kOverT>
__global__ void __launch_bounds__(kThreads) joint_backward_kernel(JointBackwardArgs a) {
  const T* h_grad = static_cast<const T*>(a.h_grad);
  T* out = static_cast<T*>(kOverT ? a.g_grad : a.f_grad);
  const Lattice& l = a.lattice;
  const int64_t outer = kOverT ? l.max_u : l.max_t, packs = a.width / kVec;
  for_each_row(l.batch * outer, [&](int64_t row) {
    const int64_t b = row / outer, fixed = row % outer;
    const int64_t t_len = l.t_len[b], u_len = l.u_len[b];
    const int64_t count = (kOverT ? fixed < u_len : fixed < t_len) ? (kOverT ? t_len : u_len) : 0;
    for_each_pack(packs, [&](int64_t pack) {
      float sum[kVec] = {};
      for (int64_t i = 0; i < count; ++i) {
        const int64_t at = row_of(l, b, kOverT ? i : fixed, kOverT ? fixed : i) * a.width + pack * kVec;
        const auto v = load_vector<kVec>(h_grad, at);
        AlignedVector<uint8_t, kVec> m;
        if (a.mask != nullptr) m = load_vector<kVec>(a.mask, at);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          if (a.mask == nullptr || m.value[k]) sum[k] += static_cast<float>(v.value[k]);
        }
      }
      AlignedVector<T, kVec> result;
#pragma unroll
      for (int k = 0; k < kVec; ++k) result.value[k] = static_cast<T>(sum[k] * a.scale);
      store_vector<kVec>(out, row * a.width + pack * kVec, result);
    });
  });
}

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

// ---- loss ----------------------------------------------------------------------------------

template <class T, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads) loss_rows_kernel(LossArgs a) {
  __shared__ Online<acc_type<T>> scratch[kMaxRowThreads / C10_WARP_SIZE];
  const T* x = static_cast<const T*>(a.x);
  const Lattice& l = a.lattice;
  for (int64_t row = blockIdx.x; row < l.rows; row += gridDim.x) {
    const Cell c = cell_of(l, row);
    if (!c.valid) {  // block-uniform: the row is never read
      if (threadIdx.x == 0) a.lse[row] = a.blank_logp[row] = a.label_logp[row] = 0.0f;
      continue;
    }
    const T* logits = x + row * a.classes;
    const Online<acc_type<T>> state = row_statistics<kRowUnroll, kVec>(logits, a.classes, scratch);
    if (threadIdx.x == 0) {
      const float lse = static_cast<float>(state.log_sum_exp());
      // Rounded to T: the log-probabilities NVIDIA apex's log_softmax in x's dtype gives.
      const auto logp = [&](int64_t v) { return static_cast<float>(static_cast<T>(static_cast<float>(logits[v]) - lse)); };
      a.lse[row] = lse;
      a.blank_logp[row] = logp(a.blank);
      a.label_logp[row] = c.u + 1 < l.u_len[c.b] ? logp(a.labels[c.b * a.label_stride + c.u]) : 0.0f;
    }
  }
}

// alpha (blockIdx.y == 0) or beta (1) of batch blockIdx.x, over anti-diagonals t + u = d; the
// beta block also writes the loss.
template <class T>
__global__ void __launch_bounds__(kMaxWavefrontThreads) wavefront_kernel(LossArgs a) {
  const Lattice& l = a.lattice;
  const int64_t b = blockIdx.x, t_len = l.t_len[b], u_len = l.u_len[b];
  const bool forward = blockIdx.y == 0;
  float* values = (forward ? a.alpha : a.beta) + b * l.max_t * l.max_u;
  for (int64_t step = 0; step < t_len + u_len - 1; ++step) {
    const int64_t d = forward ? step : t_len + u_len - 2 - step;
    for (int64_t u = threadIdx.x; u < u_len; u += blockDim.x) {
      const int64_t t = d - u;
      if (t < 0 || t >= t_len) continue;
      values[t * l.max_u + u] = forward ? alpha_at(a, b, t, u) : beta_at(a, b, t, u);
    }
    __syncthreads();  // the next diagonal reads this one
  }
  if (!forward && threadIdx.x == 0) {
    static_cast<T*>(a.loss)[b] = static_cast<T>(t_len > 0 && u_len > 0 ? -values[0] : 0.0f);
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads) loss_grad_kernel(LossBackwardArgs args) {
  const LossArgs& a = args.forward;
  const T* x = static_cast<const T*>(a.x);
  T* grad = static_cast<T*>(args.grad);
  const Lattice& l = a.lattice;
  for (int64_t row = blockIdx.x; row < l.rows; row += gridDim.x) {
    const Cell c = cell_of(l, row);
    T* out = grad + row * a.classes;
    if (!c.valid) {
      zero_row<kVec>(out, a.classes);
      continue;
    }
    const T* logits = x + row * a.classes;
    const float g = args.grad_loss[c.b];
    const CellGrad terms = cell_grad(a, c.b, c.t, c.u);
    const float scale = args.fused_softmax ? g * terms.occupancy : 0.0f;
    const float lse = a.lse[row];
    const RowSplit split = write_scaled_softmax<kRowUnroll, kVec>(logits, out, a.classes, lse, scale, 0.0f);
    // The blank's and the label's elements, rewritten by the threads that wrote them.
    const int64_t label = c.u + 1 < l.u_len[c.b] ? a.labels[c.b * a.label_stride + c.u] : -1;
    for (const int64_t v : {a.blank, label}) {
      if (v < 0 || threadIdx.x != split.owner(v) || (v == label && label == a.blank)) continue;
      const float p = expf(static_cast<float>(logits[v]) - lse);
      const float through = (v == a.blank ? terms.through_blank : 0.0f) + (v == label ? terms.through_label : 0.0f);
      out[v] = static_cast<T>(scale * p - g * through);
    }
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, std::numeric_limits<int32_t>::max())));
}

}  // namespace

void joint_forward(const Cuda& device, const JointArgs& a) {
  if (a.lattice.rows == 0 || a.width == 0) return;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_vector_width<T>(a.width, {a.f, a.g, a.h}, [&](auto width) {
      constexpr int kVec = decltype(width)::value;
      const RowGrid grid = row_grid(a.lattice.rows, a.width / kVec, device, kThreads, kBlocksPerSm);
      joint_forward_kernel<T, kVec><<<grid.grid, grid.block, 0, cuda::stream(device)>>>(a);
    });
  });
  check_launch("transducer_joint_forward");
}

void joint_backward(const Cuda& device, const JointBackwardArgs& a) {
  const Lattice& l = a.lattice;
  if (l.batch == 0 || a.width == 0) return;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_vector_width<T>(a.width, {a.h_grad, a.f_grad, a.g_grad}, [&](auto width) {
      constexpr int kVec = decltype(width)::value;
      const cudaStream_t stream = cuda::stream(device);
      const RowGrid f_grid = row_grid(l.batch * l.max_t, a.width / kVec, device, kThreads, kBlocksPerSm);
      joint_backward_kernel<T, kVec, false><<<f_grid.grid, f_grid.block, 0, stream>>>(a);
      const RowGrid g_grid = row_grid(l.batch * l.max_u, a.width / kVec, device, kThreads, kBlocksPerSm);
      joint_backward_kernel<T, kVec, true><<<g_grid.grid, g_grid.block, 0, stream>>>(a);
    });
  });
  check_launch("transducer_joint_backward");
}

void loss_forward(const Cuda& device, const LossArgs& a) {
  const Lattice& l = a.lattice;
  if (l.batch == 0) return;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const cudaStream_t stream = cuda::stream(device);
    if (l.rows > 0 && a.classes > 0) {
      const unsigned threads = row_threads<T>(a.classes, kRowUnroll, kMinRowThreads, kMaxRowThreads);
      with_vector_width<T>(a.classes, {a.x}, [&](auto width) {
        loss_rows_kernel<T, decltype(width)::value><<<row_blocks(l.rows), threads, 0, stream>>>(a);
      });
    }
    // A thread per u of a diagonal, in whole wavefronts (64 covers CUDA warps and ROCm wavefronts).
    constexpr int64_t kLanes = 64;
    const unsigned threads = static_cast<unsigned>(
        std::min<int64_t>(kMaxWavefrontThreads, std::max<int64_t>(kLanes, (l.max_u + kLanes - 1) / kLanes * kLanes)));
    wavefront_kernel<T><<<dim3(static_cast<unsigned>(l.batch), 2), threads, 0, stream>>>(a);
  });
  check_launch("transducer_loss_forward");
}

void loss_backward(const Cuda& device, const LossBackwardArgs& args) {
  const LossArgs& a = args.forward;
  if (a.lattice.rows == 0 || a.classes == 0) return;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const unsigned threads = row_threads<T>(a.classes, kRowUnroll, kMinRowThreads, kMaxRowThreads);
    with_vector_width<T>(a.classes, {a.x, args.grad}, [&](auto width) {
      loss_grad_kernel<T, decltype(width)::value>
          <<<row_blocks(a.lattice.rows), threads, 0, cuda::stream(device)>>>(args);
    });
  });
  check_launch("transducer_loss_backward");
}

}  // namespace apex::transducer
