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

// ---- warp and row kernels ----------------------------------------------------------------------

// sum of grad_y * y over the kept elements.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE float kept_dot(const Packed<T, kVec>& g, const Packed<T, kVec>& y, uint32_t keep,
                                            float sum) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) sum += (keep >> k & 1u) ? g[k] * y[k] : 0.0f;
  return sum;
}

// grad_x = scale * y * (grad_y - row_dot) where kept, 0 elsewhere.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, kVec> kept_grad(const Packed<T, kVec>& g, const Packed<T, kVec>& y,
                                                               uint32_t keep, float scale, float row_dot) {
  AlignedVector<T, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.value[k] = static_cast<T>((keep >> k & 1u) ? scale * y[k] * (g[k] - row_dot) : 0.0f);
  return out;
}

// `group` lanes per row; each lane takes kRows consecutive rows at once, kPacks vectors of grad_y and
// of y of each (as loaded: 16-bit data stays packed), all loaded before any is used.
template <class T, int kVec, int kPacks>
__global__ void __launch_bounds__(kWarpKernelThreads, kMinWarpBlocksPerSm) warp_backward(BackwardArgs a, int group) {
  constexpr int kRows = rows_per_lane(kWarpBackwardVectors, kPacks);
  if (kPacks > 1) group = C10_WARP_SIZE;  // known here: the shuffles unroll, the columns are immediates
  const T* grad_y = static_cast<const T*>(a.grad_y);
  const T* y = static_cast<const T*>(a.y);
  T* grad_x = static_cast<T*>(a.grad_x);
  const WarpRows lanes(group);
  const int member = lanes.member;
  const int64_t sets = (a.rows + kRows - 1) / kRows;
  for (int64_t first = lanes.first; first < sets; first += lanes.step) {
    const int64_t set = first + lanes.slot;
    const int64_t t0 = (set < sets ? set : first) * kRows;
    int64_t q = 0;  // the query index of row t0 + j (causal rows)
    if (a.causal) {
      int64_t rest;
      div_mod(t0, a.queries, rest, q);
    }
    Packed<T, kVec> g[kRows][kPacks], p[kRows][kPacks];
    uint32_t keep[kRows][kPacks];  // inside the causal bound
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const bool live = set < sets && t0 + j < a.rows;
      const int kept = !live ? 0 : a.causal ? static_cast<int>(std::min<int64_t>(q + 1, a.cols)) : static_cast<int>(a.cols);
      const int64_t offset = (t0 + j) * a.cols;
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        const int col = (i * group + member) * kVec;
        keep[j][i] = range_bits<kVec>(kept - col);
        g[j][i] = Packed<T, kVec>::zero();
        p[j][i] = Packed<T, kVec>::zero();
        if (col < kept) {
          g[j][i] = Packed<T, kVec>::load(grad_y, offset + col);
          p[j][i] = Packed<T, kVec>::load(y, offset + col);
        }
      }
      if (a.causal) q = q + 1 == a.queries ? 0 : q + 1;
    }
    float row_dot[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kPacks; ++i) sum = kept_dot<T, kVec>(g[j][i], p[j][i], keep[j][i], sum);
      row_dot[j] = sum;
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      row_dot[j] = cuda::group_reduce(row_dot[j], group, Sum{});
#pragma unroll
      for (int i = 0; i < kPacks; ++i) launder(g[j][i]), launder(p[j][i]);
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (set >= sets || t0 + j >= a.rows) continue;
      const int64_t offset = (t0 + j) * a.cols;
#pragma unroll
      for (int i = 0; i < kPacks; ++i) {
        const int col = (i * group + member) * kVec;
        if (col < a.cols) {
          store_vector<kVec>(grad_x, offset + col,
                             kept_grad<T, kVec>(g[j][i], p[j][i], keep[j][i], a.scale, row_dot[j]));
        }
      }
    }
  }
}

// One block, or a cluster of plan.cluster blocks (one chunk each), per row, the row's grad_y and y
// in registers (kRowBackwardVectors vectors of each per thread); see softmax_cuda.cuh. A block loads
// its next row before it reduces the current one.
template <class T, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads, 1) row_backward(BackwardArgs a, Plan plan) {
  constexpr int kVectors = kRowBackwardVectors;
  __shared__ float scratch[2][kMaxRowWarps];
  __shared__ ClusterExchange<float> cluster_sums;
  const T* grad_y = static_cast<const T*>(a.grad_y);
  const T* y = static_cast<const T*>(a.y);
  T* grad_x = static_cast<T*>(a.grad_x);
  const int cluster = plan.cluster;
  const int begin = cluster_rank() * static_cast<int>(plan.chunk);
  const int end = static_cast<int>(std::min<int64_t>(begin + plan.chunk, a.cols));
  int col[kVectors];
#pragma unroll
  for (int k = 0; k < kVectors; ++k) col[k] = begin + static_cast<int>(threadIdx.x + k * blockDim.x) * kVec;
  const BlockRows rows(a.rows, cluster, a.causal);
  if (cluster > 1) exchange_init(cluster_sums);

  // The next row's loads, issued a row ahead (vectors past its limit keep stale values, which its
  // keep bits leave out).
  Packed<T, kVec> next_g[kVectors], next_y[kVectors];
#pragma unroll
  for (int k = 0; k < kVectors; ++k) next_g[k] = Packed<T, kVec>::zero(), next_y[k] = Packed<T, kVec>::zero();
  int64_t next_offset = 0;
  int next_limit = 0;
  const auto issue = [&](int64_t t) {
    next_offset = t * a.cols;
    int64_t kept = a.cols;
    if (a.causal) {
      int64_t rest, q;
      div_mod(t, a.queries, rest, q);
      kept = std::min<int64_t>(q + 1, a.cols);
    }
    next_limit = static_cast<int>(std::min<int64_t>(end, kept));
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      if (col[k] < next_limit) {
        next_g[k] = Packed<T, kVec>::load(grad_y, next_offset + col[k]);
        next_y[k] = Packed<T, kVec>::load(y, next_offset + col[k]);
      }
    }
  };

  int64_t t = rows.first;
  if (t < rows.end) issue(t);
  for (uint32_t n = 0; t < rows.end; t += rows.step, ++n) {
    Packed<T, kVec> g[kVectors], p[kVectors];
#pragma unroll
    for (int k = 0; k < kVectors; ++k) g[k] = next_g[k], p[k] = next_y[k];
    const int64_t offset = next_offset;
    const int limit = next_limit;
    if (t + rows.step < rows.end) issue(t + rows.step);
    uint32_t keep[kVectors];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      keep[k] = range_bits<kVec>(limit - col[k]);
      sum = kept_dot<T, kVec>(g[k], p[k], keep[k], sum);
    }
    float row_dot = block_all_reduce_once(sum, Sum{}, 0.0f, scratch, static_cast<int>(n & 1u));
    if (cluster > 1) row_dot = exchange(cluster_sums, row_dot, Sum{}, 0.0f, cluster, n);
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      launder(g[k]), launder(p[k]);
      if (col[k] < end) {
        store_vector<kVec>(grad_x, offset + col[k], kept_grad<T, kVec>(g[k], p[k], keep[k], a.scale, row_dot));
      }
    }
  }
  if (cluster > 1) exchange_finish();
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
  static_assert(kWarpBackwardVectors == 4, "one warp kernel instance per power of two up to kWarpBackwardVectors");
  void (*const warp_kernels[])(BackwardArgs, int) = {warp_backward<T, kVec, 1>, warp_backward<T, kVec, 2>,
                                                      warp_backward<T, kVec, 4>};
  // The row kernel takes vector data only; scalar rows past the warp kernel take the block kernel.
  void (*row_kernel)(BackwardArgs, Plan) = nullptr;
  if constexpr (kVec > 1) row_kernel = row_backward<T, kVec>;
  // Staged (block kernel): the chunk of grad_y and of y.
  run_rows(args, device, kVec, kRowBackwardVectors, 2.0 * sizeof(T), row_kernel, block_backward<T, kVec>, warp_kernels,
           "fused_softmax backward");
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
