// fused_softmax: the backward CUDA kernels, grad_x = scale * y * (grad_y - sum(grad_y * y)) per row,
// into a fresh grad_x. Kernel shapes and the plan: softmax_cuda.cuh. Causal rows read grad_y and y
// only up to the diagonal (y is 0 past it, and so is grad_x, written without reading anything).
#include "softmax_cuda.cuh"

namespace apex::fused_softmax {
namespace {

// Columns of row r that can be nonzero.
C10_DEVICE C10_ALWAYS_INLINE int64_t kept_columns(const BackwardArgs& a, int64_t r) {
  return a.causal ? std::min<int64_t>(r % a.queries + 1, a.cols) : a.cols;
}

// sum over the vector's columns below `kept` of grad_y * y.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE float dot(const AlignedVector<T, kVec>& g, const AlignedVector<T, kVec>& y, int64_t col,
                                       int64_t kept) {
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (col + k < kept) sum += static_cast<float>(g.value[k]) * static_cast<float>(y.value[k]);
  }
  return sum;
}

template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, kVec> input_grad(const AlignedVector<T, kVec>& g,
                                                                const AlignedVector<T, kVec>& y, int64_t col,
                                                                int64_t kept, float scale, float row_dot) {
  AlignedVector<T, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float p = static_cast<float>(y.value[k]);
    out.value[k] = static_cast<T>(col + k < kept ? scale * p * (static_cast<float>(g.value[k]) - row_dot) : 0.0f);
  }
  return out;
}

// `group` lanes per row, kPacks vectors of grad_y and of y in each lane's registers (raw, 16-bit
// data stays packed).
template <class T, int kVec, int kPacks>
__global__ void __launch_bounds__(kWarpKernelThreads) warp_backward(BackwardArgs a, int group) {
  const T* grad_y = static_cast<const T*>(a.grad_y);
  const T* y = static_cast<const T*>(a.y);
  T* grad_x = static_cast<T*>(a.grad_x);
  const WarpRows rows(group);
  const int member = rows.member;
  for (int64_t first = rows.first; first < a.rows; first += rows.step) {
    const int64_t r = first + rows.row_in_warp;
    const bool live = r < a.rows;
    const int64_t offset = r * a.cols, kept = live ? kept_columns(a, r) : 0;
    AlignedVector<T, kVec> g[kPacks], p[kPacks];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t col = (static_cast<int64_t>(i) * group + member) * kVec;
      if (col < kept) {
        g[i] = load_vector<kVec>(grad_y, offset + col);
        p[i] = load_vector<kVec>(y, offset + col);
        sum += dot<T, kVec>(g[i], p[i], col, kept);
      }
    }
    const float row_dot = cuda::group_reduce(sum, group, Sum{});
    if (!live) continue;
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int64_t col = (static_cast<int64_t>(i) * group + member) * kVec;
      if (col < a.cols) {
        store_vector<kVec>(grad_x, offset + col,
                           col < kept ? input_grad<T, kVec>(g[i], p[i], col, kept, a.scale, row_dot) : zeros<T, kVec>());
      }
    }
  }
}

// One block (or a cluster of plan.cluster blocks, one chunk each) per row; see softmax_cuda.cuh.
// Staged chunks keep grad_y in the first half of the shared memory and y in the second.
template <class T, int kVec>
__global__ void __launch_bounds__(kMaxBlockThreads, kMinBlocksPerSm) block_backward(BackwardArgs a, Plan plan) {
  extern __shared__ float4 dynamic_smem[];  // float4: 16-byte aligned
  T* staged_g = reinterpret_cast<T*>(dynamic_smem);
  T* staged_y = staged_g + plan.chunk;  // plan.chunk is a multiple of kVec: still 16-byte aligned
  __shared__ float scratch[kMaxBlockThreads / C10_WARP_SIZE];
  __shared__ float block_total;
  __shared__ float cluster_slot;
  const T* grad_y = static_cast<const T*>(a.grad_y);
  const T* y = static_cast<const T*>(a.y);
  T* grad_x = static_cast<T*>(a.grad_x);
  const int64_t begin = static_cast<int64_t>(cluster_rank()) * plan.chunk;
  const int64_t end = std::min<int64_t>(begin + plan.chunk, a.cols);
  const int64_t step = static_cast<int64_t>(blockDim.x) * kVec;
  const int64_t first_col = begin + static_cast<int64_t>(threadIdx.x) * kVec;
  for (int64_t r = blockIdx.x / plan.cluster; r < a.rows; r += gridDim.x / plan.cluster) {
    const int64_t offset = r * a.cols, kept = kept_columns(a, r);
    const int64_t kept_end = std::min(end, kept);
    float sum = 0.0f;
    // Pass 1: this chunk's part of sum(grad_y * y), staging each thread's own slots.
    for (int64_t col0 = first_col; col0 < kept_end; col0 += kBackwardUnroll * step) {
      AlignedVector<T, kVec> g[kBackwardUnroll], p[kBackwardUnroll];
#pragma unroll
      for (int u = 0; u < kBackwardUnroll; ++u) {
        const int64_t col = col0 + u * step;
        if (col < kept_end) {
          g[u] = load_vector<kVec>(grad_y, offset + col);
          p[u] = load_vector<kVec>(y, offset + col);
        }
      }
#pragma unroll
      for (int u = 0; u < kBackwardUnroll; ++u) {
        const int64_t col = col0 + u * step;
        if (col < kept_end) {
          sum += dot<T, kVec>(g[u], p[u], col, kept);
          if (plan.staged) {
            store_vector<kVec>(staged_g, col - begin, g[u]);
            store_vector<kVec>(staged_y, col - begin, p[u]);
          }
        }
      }
    }
    sum = cuda::block_all_reduce(sum, Sum{}, 0.0f, scratch, &block_total);
    const float row_dot = cluster_all_reduce(sum, Sum{}, 0.0f, plan.cluster, &cluster_slot);
    // Pass 2: grad_x of the chunk; zeros past the causal bound, never read.
#pragma unroll 4
    for (int64_t col = first_col; col < end; col += step) {
      AlignedVector<T, kVec> out = zeros<T, kVec>();
      if (col < kept_end) {
        if (plan.staged) {
          out = input_grad<T, kVec>(load_vector<kVec>(staged_g, col - begin), load_vector<kVec>(staged_y, col - begin),
                                    col, kept, a.scale, row_dot);
        } else {
          out = input_grad<T, kVec>(load_vector<kVec>(grad_y, offset + col), load_vector<kVec>(y, offset + col), col,
                                    kept, a.scale, row_dot);
        }
      }
      store_vector<kVec>(grad_x, offset + col, out);
    }
  }
}

template <class T, int kVec>
void run(const BackwardArgs& args, const Cuda& device) {
  static_assert(kMaxBackwardPacks == 4, "one warp kernel instance per power of two up to kMaxBackwardPacks");
  void (*const warp_kernels[])(BackwardArgs, int) = {warp_backward<T, kVec, 1>, warp_backward<T, kVec, 2>,
                                                      warp_backward<T, kVec, 4>};
  // Staged: the chunk of grad_y and of y.
  run_rows(args, device, kVec, 2.0 * sizeof(T), block_backward<T, kVec>, warp_kernels, "fused_softmax backward");
}

}  // namespace

void backward(const Cuda& device, const BackwardArgs& args) {
  if (args.rows == 0 || args.cols == 0) return;
  dispatch_floating<false>(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vector_path<T>(args.cols, {args.grad_y, args.y, args.grad_x})) {
      run<T, vector_width<T>()>(args, device);
    } else {
      run<T, 1>(args, device);
    }
  });
}

}  // namespace apex::fused_softmax
