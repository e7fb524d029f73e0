// fused_softmax: the forward CUDA kernels, y = softmax(scale * x) over each row with masked columns
// taking no part (y = 0). Kernel shapes and the plan: softmax_cuda.cuh. Causal rows load only the
// columns up to the diagonal and write zeros past it without reading anything.
#include "softmax_cuda.cuh"

namespace apex::fused_softmax {
namespace {

// Where the i-th row a kernel handles lives. With a mask, rows go head-fastest ((b, q, h) order),
// so the heads sharing a mask row ([b, 1, sq, sk] masks) run back to back and find it in L2.
struct RowRef {
  int64_t offset;       // of the row's first element in x and y
  int64_t kept;         // columns past this are masked (causal); else cols
  const uint8_t* mask;  // the row's mask, or null
};

C10_DEVICE RowRef locate(const ForwardArgs& a, int64_t i) {
  if (a.mask == nullptr) {
    const int64_t q = i % a.queries;
    return {i * a.cols, a.causal ? std::min<int64_t>(q + 1, a.cols) : a.cols, nullptr};
  }
  const int64_t h = i % a.heads, q = (i / a.heads) % a.queries, b = i / (a.heads * a.queries);
  const int64_t row = (b * a.heads + h) * a.queries + q;
  return {row * a.cols, a.causal ? std::min<int64_t>(q + 1, a.cols) : a.cols,
          a.mask + b * a.mask_batch_stride + h * a.mask_head_stride + q * a.mask_query_stride};
}

// Bit k set: column col + k is kept (inside the causal bound and not masked).
template <int kVec>
C10_DEVICE C10_ALWAYS_INLINE uint32_t kept_bits(const RowRef& row, int64_t col) {
  uint32_t bits = 0;
  if (row.mask != nullptr) {
    const AlignedVector<uint8_t, kVec> masked = load_vector<kVec>(row.mask, col);
#pragma unroll
    for (int k = 0; k < kVec; ++k) bits |= (masked.value[k] == 0 && col + k < row.kept ? 1u : 0u) << k;
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) bits |= (col + k < row.kept ? 1u : 0u) << k;
  }
  return bits;
}

// v[k] = x[k] * scale (exp2 domain) where kept, -inf where not; returns the largest.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE float scaled(const AlignedVector<T, kVec>& x, uint32_t bits, float scale, float (&v)[kVec]) {
  float most = kNegInf;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    v[k] = (bits >> k & 1u) ? static_cast<float>(x.value[k]) * scale : kNegInf;
    most = fmaxf(most, v[k]);
  }
  return most;
}

// y of kept columns from their scaled value; zeros elsewhere (and for -inf scores).
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, kVec> probabilities(const AlignedVector<T, kVec>& x, uint32_t bits,
                                                                   float scale, const Stats& row) {
  const float inv = inverse_sum(row.sum);
  AlignedVector<T, kVec> y;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float v = static_cast<float>(x.value[k]) * scale;
    y.value[k] = static_cast<T>((bits >> k & 1u) && v != kNegInf ? exp2f(v - row.max) * inv : 0.0f);
  }
  return y;
}

// `group` lanes per row, kPacks vectors of the row in each lane's registers.
template <class T, int kVec, int kPacks>
__global__ void __launch_bounds__(kWarpKernelThreads, kMinWarpBlocksPerSm) warp_forward(ForwardArgs a, int group) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const float scale = a.scale * kLog2e;
  const WarpRows rows(group);
  const int member = rows.member;
  for (int64_t first = rows.first; first < a.rows; first += rows.step) {
    const int64_t i = first + rows.row_in_warp;
    const bool live = i < a.rows;
    const RowRef row = locate(a, live ? i : first);
    float v[kPacks][kVec];
    float most = kNegInf;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t col = (static_cast<int64_t>(p) * group + member) * kVec;
      if (live && col < row.kept) {
        most = fmaxf(most, scaled<T, kVec>(load_vector<kVec>(x, row.offset + col), kept_bits<kVec>(row, col), scale, v[p]));
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[p][k] = kNegInf;
      }
    }
    most = cuda::group_reduce(most, group, Max{});
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        v[p][k] = v[p][k] == kNegInf ? 0.0f : exp2f(v[p][k] - most);
        sum += v[p][k];
      }
    }
    const float inv = inverse_sum(cuda::group_reduce(sum, group, Sum{}));
    if (!live) continue;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int64_t col = (static_cast<int64_t>(p) * group + member) * kVec;
      if (col < a.cols) {
        AlignedVector<T, kVec> out;
#pragma unroll
        for (int k = 0; k < kVec; ++k) out.value[k] = static_cast<T>(v[p][k] * inv);
        store_vector<kVec>(y, row.offset + col, out);
      }
    }
  }
}

// One block (or a cluster of plan.cluster blocks, one chunk each) per row; see softmax_cuda.cuh.
template <class T, int kVec>
__global__ void __launch_bounds__(kMaxBlockThreads, kMinBlocksPerSm) block_forward(ForwardArgs a, Plan plan) {
  extern __shared__ float4 dynamic_smem[];  // float4: 16-byte aligned
  T* staged = reinterpret_cast<T*>(dynamic_smem);
  uint8_t* staged_bits = reinterpret_cast<uint8_t*>(staged + plan.chunk);  // one byte per vector
  __shared__ Stats scratch[kMaxBlockThreads / C10_WARP_SIZE];
  __shared__ Stats block_total;
  __shared__ Stats cluster_slot;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const float scale = a.scale * kLog2e;
  const int64_t begin = static_cast<int64_t>(cluster_rank()) * plan.chunk;
  const int64_t end = std::min<int64_t>(begin + plan.chunk, a.cols);
  const int64_t step = static_cast<int64_t>(blockDim.x) * kVec;
  const int64_t first_col = begin + static_cast<int64_t>(threadIdx.x) * kVec;
  // Every block of a cluster handles the same rows, so all reach the same cluster barriers.
  for (int64_t i = blockIdx.x / plan.cluster; i < a.rows; i += gridDim.x / plan.cluster) {
    const RowRef row = locate(a, i);
    const int64_t kept_end = std::min(end, row.kept);
    Stats stats = Stats::empty();
    // Pass 1: the statistics of this chunk, staging what each thread loads (its own slots only,
    // which it alone reads in pass 2: no barrier needed around the staging).
    for (int64_t col0 = first_col; col0 < kept_end; col0 += kForwardUnroll * step) {
      AlignedVector<T, kVec> in[kForwardUnroll];
#pragma unroll
      for (int u = 0; u < kForwardUnroll; ++u) {
        if (col0 + u * step < kept_end) in[u] = load_vector<kVec>(x, row.offset + col0 + u * step);
      }
#pragma unroll
      for (int u = 0; u < kForwardUnroll; ++u) {
        const int64_t col = col0 + u * step;
        if (col < kept_end) {
          const uint32_t bits = kept_bits<kVec>(row, col);
          float v[kVec];
          stats.absorb<kVec>(v, scaled<T, kVec>(in[u], bits, scale, v));
          if (plan.staged) {
            store_vector<kVec>(staged, col - begin, in[u]);
            staged_bits[(col - begin) / kVec] = static_cast<uint8_t>(bits);
          }
        }
      }
    }
    stats = cuda::block_all_reduce(stats, MergeStats{}, Stats::empty(), scratch, &block_total);
    stats = cluster_all_reduce(stats, MergeStats{}, Stats::empty(), plan.cluster, &cluster_slot);
    // Pass 2: the chunk's probabilities; zeros past the causal bound, never read.
#pragma unroll 4
    for (int64_t col = first_col; col < end; col += step) {
      AlignedVector<T, kVec> out = zeros<T, kVec>();
      if (col < kept_end) {
        if (plan.staged) {
          out = probabilities<T, kVec>(load_vector<kVec>(staged, col - begin), staged_bits[(col - begin) / kVec],
                                       scale, stats);
        } else {
          out = probabilities<T, kVec>(load_vector<kVec>(x, row.offset + col), kept_bits<kVec>(row, col), scale, stats);
        }
      }
      store_vector<kVec>(y, row.offset + col, out);
    }
  }
}

template <class T, int kVec>
void run(const ForwardArgs& args, const Cuda& device) {
  static_assert(kMaxForwardPacks == 8, "one warp kernel instance per power of two up to kMaxForwardPacks");
  void (*const warp_kernels[])(ForwardArgs, int) = {warp_forward<T, kVec, 1>, warp_forward<T, kVec, 2>,
                                                     warp_forward<T, kVec, 4>, warp_forward<T, kVec, 8>};
  // Staged: the chunk's elements and one byte of keep bits per vector.
  run_rows(args, device, kVec, sizeof(T) + 1.0 / kVec, block_forward<T, kVec>, warp_kernels, "fused_softmax forward");
}

}  // namespace

void forward(const Cuda& device, const ForwardArgs& args) {
  if (args.rows == 0 || args.cols == 0) return;
  dispatch_floating<false>(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vector_width<T>();
    // The mask is read kVec bytes at a time: its rows must start kVec-aligned too.
    const bool mask_aligned = args.mask == nullptr ||
                              (is_aligned(args.mask, kVec) && args.mask_batch_stride % kVec == 0 &&
                               args.mask_head_stride % kVec == 0 && args.mask_query_stride % kVec == 0);
    if (mask_aligned && vector_path<T>(args.cols, {args.x, args.y})) {
      run<T, kVec>(args, device);
    } else {
      run<T, 1>(args, device);
    }
  });
}

}  // namespace apex::fused_softmax
