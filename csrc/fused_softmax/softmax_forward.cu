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

// ---- warp and row kernels ----------------------------------------------------------------------

// A row by its (batch, head, query) indices; row_at and next_row walk the kernels' visiting order.
struct RowIndex {
  int64_t b, h, q;
};

// Whether the warp and row kernels visit rows head-fastest: the mask has one row per (b, q) shared
// by the heads, which consecutive rows then reuse (else storage order, (b, h, q)).
C10_DEVICE C10_ALWAYS_INLINE bool heads_share_mask(const ForwardArgs& a) {
  return a.mask != nullptr && a.mask_head_stride == 0 && a.heads > 1;
}

// The row visited t-th.
C10_DEVICE C10_ALWAYS_INLINE RowIndex row_at(const ForwardArgs& a, int64_t t, bool head_fastest) {
  RowIndex r;
  int64_t rest;
  if (head_fastest) {
    div_mod(t, a.heads, rest, r.h);
    div_mod(rest, a.queries, r.b, r.q);
  } else {
    div_mod(t, a.queries, rest, r.q);
    div_mod(rest, a.heads, r.b, r.h);
  }
  return r;
}

// The row visited after r (no division).
C10_DEVICE C10_ALWAYS_INLINE void next_row(const ForwardArgs& a, RowIndex& r, bool head_fastest) {
  if (head_fastest) {
    if (++r.h == a.heads) {
      r.h = 0;
      if (++r.q == a.queries) r.q = 0, ++r.b;
    }
  } else if (++r.q == a.queries) {
    r.q = 0;
    if (++r.h == a.heads) r.h = 0, ++r.b;
  }
}

C10_DEVICE C10_ALWAYS_INLINE int64_t row_offset(const ForwardArgs& a, const RowIndex& r) {
  return ((r.b * a.heads + r.h) * a.queries + r.q) * a.cols;
}

// Columns past this are masked by the causal bound.
C10_DEVICE C10_ALWAYS_INLINE int64_t row_kept(const ForwardArgs& a, const RowIndex& r) {
  return a.causal ? std::min<int64_t>(r.q + 1, a.cols) : a.cols;
}

C10_DEVICE C10_ALWAYS_INLINE const uint8_t* mask_row(const ForwardArgs& a, const RowIndex& r) {
  return a.mask + r.b * a.mask_batch_stride + r.h * a.mask_head_stride + r.q * a.mask_query_stride;
}

// The kept elements' largest scaled value (exp2 domain); -inf if none.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE float kept_max(const Packed<T, kVec>& x, uint32_t keep, float scale, float most) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (keep >> k & 1u) most = fmaxf(most, x[k] * scale);
  }
  return most;
}

// sum of exp2(x * scale - base) over the kept elements.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE float kept_sum(const Packed<T, kVec>& x, uint32_t keep, float scale, float base,
                                            float sum) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float e = fast_exp2(fmaf(x[k], scale, -base));
    sum += (keep >> k & 1u) ? e : 0.0f;
  }
  return sum;
}

// y = exp2(x * scale - base) * inv where kept, 0 elsewhere.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE AlignedVector<T, kVec> kept_probabilities(const Packed<T, kVec>& x, uint32_t keep,
                                                                        float scale, float base, float inv) {
  AlignedVector<T, kVec> y;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float e = fast_exp2(fmaf(x[k], scale, -base)) * inv;
    y.value[k] = static_cast<T>((keep >> k & 1u) ? e : 0.0f);
  }
  return y;
}

// `group` lanes per row; each lane takes kRows consecutive rows (of the visiting order) at once,
// kPacks vectors of each, all loaded before any is used. With a mask shared by the heads the
// kRows rows are heads of one (b, q) (or of two, where np is not a multiple of kRows): a row whose
// mask row is the previous row's reuses its bits instead of loading them again.
template <class T, int kVec, int kPacks>
__global__ void __launch_bounds__(kWarpKernelThreads, kMinWarpBlocksPerSm) warp_forward(ForwardArgs a, int group) {
  constexpr int kRows = rows_per_lane(kWarpForwardVectors, kPacks);
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const float scale = a.scale * kLog2e;
  if (kPacks > 1) group = C10_WARP_SIZE;  // known here: the shuffles unroll, the columns are immediates
  const bool head_fastest = heads_share_mask(a);
  const WarpRows lanes(group);
  const int member = lanes.member;
  const int64_t sets = (a.rows + kRows - 1) / kRows;
  for (int64_t first = lanes.first; first < sets; first += lanes.step) {
    const int64_t set = first + lanes.slot;
    const int64_t t0 = (set < sets ? set : first) * kRows;
    const RowIndex r0 = row_at(a, t0, head_fastest);
    RowIndex r = r0;
    Packed<T, kVec> in[kRows][kPacks];
    MaskBytes<kVec> masked[kRows][kPacks];
    uint32_t keep[kRows][kPacks];  // which elements take part: inside the causal bound, then not masked
    bool reuse[kRows];
    const uint8_t* previous = nullptr;
    // Every load of the kRows rows first.
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const bool live = set < sets && t0 + j < a.rows;
      const int64_t offset = row_offset(a, r);
      const int kept = live ? static_cast<int>(row_kept(a, r)) : 0;
      const uint8_t* mask = a.mask != nullptr ? mask_row(a, r) : nullptr;
      reuse[j] = j > 0 && mask == previous;
      previous = mask;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        const int col = (p * group + member) * kVec;
        keep[j][p] = range_bits<kVec>(kept - col);
        in[j][p] = Packed<T, kVec>::zero();
        masked[j][p] = MaskBytes<kVec>::zero();
        if (col < kept) in[j][p] = Packed<T, kVec>::load(x, offset + col);
        // Up to cols, not kept: a row reusing these bits may keep more columns.
        if (mask != nullptr && live && !reuse[j] && col < a.cols) masked[j][p] = MaskBytes<kVec>::load(mask, col);
      }
      if (j + 1 < kRows) next_row(a, r, head_fastest);
    }
    uint32_t bits[kPacks] = {};
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        bits[p] = reuse[j] ? bits[p] : masked[j][p].bits();
        keep[j][p] &= ~bits[p];
      }
    }
    float base[kRows], inv[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      float most = kNegInf;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) most = kept_max<T, kVec>(in[j][p], keep[j][p], scale, most);
      base[j] = most;
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      base[j] = exp_base(cuda::group_reduce(base[j], group, Max{}));
#pragma unroll
      for (int p = 0; p < kPacks; ++p) launder(in[j][p]);
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      float sum = 0.0f;
#pragma unroll
      for (int p = 0; p < kPacks; ++p) sum = kept_sum<T, kVec>(in[j][p], keep[j][p], scale, base[j], sum);
      inv[j] = sum;
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      inv[j] = inverse_sum(cuda::group_reduce(inv[j], group, Sum{}));
#pragma unroll
      for (int p = 0; p < kPacks; ++p) launder(in[j][p]);
    }
    r = r0;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (set < sets && t0 + j < a.rows) {
        const int64_t offset = row_offset(a, r);
#pragma unroll
        for (int p = 0; p < kPacks; ++p) {
          const int col = (p * group + member) * kVec;
          if (col < a.cols) {
            store_vector<kVec>(y, offset + col,
                               kept_probabilities<T, kVec>(in[j][p], keep[j][p], scale, base[j], inv[j]));
          }
        }
      }
      if (j + 1 < kRows) next_row(a, r, head_fastest);
    }
  }
}

// One block, or a cluster of plan.cluster blocks (one chunk each), per row, the row in registers
// (kRowForwardVectors vectors per thread); see softmax_cuda.cuh. A block loads its next row before
// it reduces the current one, and loads a mask row only when it differs from the current row's
// (heads of one (b, q) run back to back): the thread keeps the mask as bits in one register.
template <class T, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads, 1) row_forward(ForwardArgs a, Plan plan) {
  constexpr int kVectors = kRowForwardVectors;
  static_assert(kVectors * kVec <= 32, "a thread's mask bits fit one 32-bit word");
  __shared__ Stats scratch[2][kMaxRowWarps];
  __shared__ ClusterExchange<Stats> cluster_stats;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const float scale = a.scale * kLog2e;
  const bool head_fastest = heads_share_mask(a);
  const int cluster = plan.cluster;
  const int begin = cluster_rank() * static_cast<int>(plan.chunk);
  const int end = static_cast<int>(std::min<int64_t>(begin + plan.chunk, a.cols));
  // The column of this thread's k-th vector (computed where used: an array of them took registers).
  const int col0 = begin + static_cast<int>(threadIdx.x) * kVec, stride = static_cast<int>(blockDim.x) * kVec;
  const auto column = [&](int k) { return col0 + k * stride; };
  const BlockRows rows(a.rows, cluster, a.causal);
  if (cluster > 1) exchange_init(cluster_stats);

  // The next row's loads, issued a row ahead. Vectors a row does not load keep stale values, which
  // its keep bits (0 past min(end, kept)) leave out.
  Packed<T, kVec> next[kVectors];
  MaskBytes<kVec> next_mask[kVectors];
#pragma unroll
  for (int k = 0; k < kVectors; ++k) next[k] = Packed<T, kVec>::zero(), next_mask[k] = MaskBytes<kVec>::zero();
  int64_t next_offset = 0;
  int next_limit = 0;
  const uint8_t* next_mask_row = nullptr;
  const uint8_t* mask_row_now = nullptr;  // the mask row `bits` holds
  uint32_t bits = 0;                      // bit k * kVec + e: element e of vector k is masked
  const auto issue = [&](int64_t t) {
    const RowIndex r = row_at(a, t, head_fastest);
    next_offset = row_offset(a, r);
    next_limit = static_cast<int>(std::min<int64_t>(end, row_kept(a, r)));
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      if (column(k) < next_limit) next[k] = Packed<T, kVec>::load(x, next_offset + column(k));
    }
    next_mask_row = a.mask != nullptr ? mask_row(a, r) : nullptr;
    if (next_mask_row != mask_row_now) {
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
        if (column(k) < end) next_mask[k] = MaskBytes<kVec>::load(next_mask_row, column(k));
      }
    }
  };

  int64_t t = rows.first;
  if (t < rows.end) issue(t);
  for (uint32_t n = 0; t < rows.end; t += rows.step, ++n) {
    Packed<T, kVec> in[kVectors];
#pragma unroll
    for (int k = 0; k < kVectors; ++k) in[k] = next[k];
    const int64_t offset = next_offset;
    const int limit = next_limit;
    if (next_mask_row != mask_row_now) {
      bits = 0;
#pragma unroll
      for (int k = 0; k < kVectors; ++k) bits |= next_mask[k].bits() << (k * kVec);
      mask_row_now = next_mask_row;
    }
    if (t + rows.step < rows.end) issue(t + rows.step);
    uint32_t keep[kVectors];
    float most = kNegInf;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      keep[k] = range_bits<kVec>(limit - column(k)) & ~(bits >> (k * kVec));
      most = kept_max<T, kVec>(in[k], keep[k], scale, most);
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      launder(in[k]);
      sum = kept_sum<T, kVec>(in[k], keep[k], scale, exp_base(most), sum);
    }
    Stats stats =
        block_all_reduce_once(Stats{most, sum}, MergeStats{}, Stats::empty(), scratch, static_cast<int>(n & 1u));
    if (cluster > 1) stats = exchange(cluster_stats, stats, MergeStats{}, Stats::empty(), cluster, n);
    const float base = exp_base(stats.max), inv = inverse_sum(stats.sum);
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      launder(in[k]);
      if (column(k) < end) {
        store_vector<kVec>(y, offset + column(k), kept_probabilities<T, kVec>(in[k], keep[k], scale, base, inv));
      }
    }
  }
  if (cluster > 1) exchange_finish();
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
  static_assert(kWarpForwardVectors == 8, "one warp kernel instance per power of two up to kWarpForwardVectors");
  void (*const warp_kernels[])(ForwardArgs, int) = {warp_forward<T, kVec, 1>, warp_forward<T, kVec, 2>,
                                                     warp_forward<T, kVec, 4>, warp_forward<T, kVec, 8>};
  // The row kernel takes vector data only; scalar rows past the warp kernel take the block kernel.
  void (*row_kernel)(ForwardArgs, Plan) = nullptr;
  if constexpr (kVec > 1) row_kernel = row_forward<T, kVec>;
  // Staged (block kernel): the chunk's elements and one byte of keep bits per vector.
  run_rows(args, device, kVec, kRowForwardVectors, sizeof(T) + 1.0 / kVec, row_kernel, block_forward<T, kVec>,
           warp_kernels, "fused_softmax forward");
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
