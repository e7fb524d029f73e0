#pragma once
// LayerNorm / RMSNorm backward on CUDA: the kernels and backward_typed<T, W>, which
// layer_norm_backward_<dtypes>.cu instantiate, one dtype pair each (so that ninja compiles them in
// parallel: all pairs in one file took 83 s), and layer_norm_backward.cu dispatches to.
//
// grad_input needs two sums per row (of g*dy and of g*dy*xhat); grad_weight / grad_bias are
// sums over rows. The main kernel keeps each row in registers (as loaded, 16-bit elements two
// to a register), so x (or y) and dy are read once and dx written once; a persistent grid lets
// every block add its rows' dy*xhat and dy into per-block fp32 accumulators in shared memory
// (each thread owns its columns: no atomics), written out once as one partial row per block.
// One small launch then sums the partial rows of both parameter grads. Rows that cannot be
// vectorized take scalar kernels (two passes per row, and a column kernel for the parameter
// grads that re-reads the inputs).

#include "layer_norm_cuda.cuh"

namespace apex::layer_norm {

// Row elements per thread in the register-resident backward: x (or y) and dy of each stay in
// registers in their own dtype, 1 register per element for fp32 pairs, half that for bf16/fp16.
constexpr int kMaxBackwardElements = 32;
// 16-byte vectors per thread the backward layout aims at (more only when a row needs more than
// kMaxRegisterRowThreads threads at this many). Measured on an H100 against 4 and 8: fewer
// registers per thread, hence more resident warps, beat more loads in flight per thread
// (benchmarks/normalization/NOTES.md).
constexpr int kBackwardItems = 2;
// Prefetching the next row doubles those registers; allowed while one row slice of a thread
// (x and dy bytes) stays within this, so a thread needs at most 112 registers, without spills.
constexpr int kMaxPrefetchSliceBytes = 128;
// Registers a backward thread needs beyond its row data (addresses, loop state, one vector's
// temporaries): measured with ptxas -v as the least that leaves the row loop free of spills.
constexpr int kBackwardRegisterOverhead = 48;
constexpr int kMaxRegistersPerThread = 128;  // what kMaxRegisterRowThreads threads per block allow

// Register cap of a backward_in_registers instance: its row data (twice when prefetching) plus
// the overhead. Without a cap ptxas hoists loads of later vectors early and holds them (128
// registers at 4 vectors per thread), which halves the blocks an SM holds. The memory-efficient
// path (a division per element) keeps the full allowance.
template <typename T, typename W, int ITEMS, bool MEMORY_EFFICIENT, bool PREFETCH>
constexpr int backward_registers() {
  constexpr int kDataRegisters = ITEMS * vector_width<T>() * int(sizeof(T) + sizeof(W)) / 4 * (PREFETCH ? 2 : 1);
  constexpr int kWanted = (kDataRegisters + kBackwardRegisterOverhead + 7) / 8 * 8;  // allocation granularity
  return MEMORY_EFFICIENT || kWanted > kMaxRegistersPerThread ? kMaxRegistersPerThread : kWanted;
}

// A kernel's register cap (CUDA 12.4+). ROCm has no such attribute: its compiler chooses.
#if defined(USE_ROCM)
#define APEX_LN_MAX_REGISTERS(n)
#else
#define APEX_LN_MAX_REGISTERS(n) __maxnreg__(n)
#endif

// V elements of T as one thread loaded them, kept as 32-bit words. Held as AlignedVector<T, V>,
// a bf16/half vector is split at the load into one 16-bit value per register (twice the
// registers of the data); as words, two elements share a register until each use unpacks them.
template <typename T, int V>
struct PackedVector {
  static constexpr int kWords = V * int(sizeof(T)) / int(sizeof(uint32_t));
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "16- and 32-bit element types");
  uint32_t word[kWords];

  // Elements [offset, offset + V) of base, offset a multiple of V.
  __device__ __forceinline__ void load(const T* base, int64_t offset) {
    const auto words = load_vector<kWords>(reinterpret_cast<const uint32_t*>(base + offset), 0);
#pragma unroll
    for (int i = 0; i < kWords; ++i) word[i] = words.value[i];
  }

  // Element j (a compile-time constant after unrolling) in float.
  __device__ __forceinline__ float get(int j) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(word[j]);
    } else {
      const uint32_t w = word[j / 2];
      const bool high = j % 2 == 1;
      if constexpr (std::is_same_v<T, c10::BFloat16>) return __uint_as_float(high ? w & 0xffff0000u : w << 16);
      return __half2float(__ushort_as_half(static_cast<unsigned short>(high ? w >> 16 : w & 0xffffu)));
    }
  }

  // Hides the words from the optimizer: elements unpacked before this point are unpacked again
  // after it instead of staying live, in float registers, across whatever lies between (a row
  // reduction). Costs no instruction.
  __device__ __forceinline__ void unpack_again_after_this() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) asm volatile("" : "+r"(word[i]));
  }
};

template <typename T, typename W>
struct BackwardParams {
  using A = Acc<T>;
  const W* dy;
  const T* x_or_y;
  const A* mean;  // nullable (RMSNorm)
  const A* invvar;
  const W* gamma;  // nullable
  const W* beta;   // nullable; read only when memory_efficient
  T* dx;
  A* dgamma_parts;  // [parts, cols] or nullptr when no grad_weight
  A* dbeta_parts;   // [parts, cols] or nullptr when no grad_bias
  int64_t rows;
  int cols;
  A inv_cols;  // 1 / cols: row means by one multiply
  A eps;
  bool memory_efficient;

  __device__ NormalizedInput<A> normalizer(int64_t row) const {
    return {mean && !memory_efficient ? mean[row] : A(0), invvar[row], eps, memory_efficient, gamma != nullptr,
            memory_efficient && beta != nullptr};
  }
};

// *acc += add, as whole-vector shared-memory accesses.
template <typename A, int V>
__device__ __forceinline__ void accumulate(AlignedVector<A, V>* acc, const AlignedVector<A, V>& add) {
  AlignedVector<A, V> sum = *acc;
#pragma unroll
  for (int j = 0; j < V; ++j) sum.value[j] += add.value[j];
  *acc = sum;
}

// One thread's part of a row, as loaded: its ITEMS vectors of x (or y) and dy, and the row's statistics.
template <typename T, typename W, int ITEMS>
struct RowSlice {
  static constexpr int V = vector_width<T>();
  PackedVector<T, V> x[ITEMS];
  PackedVector<W, V> dy[ITEMS];
  Acc<T> mean, invvar;
};

// Register-resident backward over a persistent grid. Each thread owns the same ITEMS vectors of
// columns in every row it visits, so the parameter-grad terms go to fixed per-thread slots of the
// block's shared-memory accumulators. Per row: one pass sums g*dy and g*dy*xhat (xhat computed
// from the raw x), a block reduction, a second pass recomputes xhat and writes dx. PREFETCH issues
// the loads of the thread's next row before working on the current one, so a block keeps memory
// busy through its reductions even when only one block fits on an SM (wide rows).
// MEMORY_EFFICIENT (x_or_y holds y) is a template parameter so that the usual path carries none of
// the divisions that recover xhat from y, and their registers.
template <typename T, typename W, int ITEMS, bool RMS, bool MEMORY_EFFICIENT, bool PREFETCH>
__global__ void APEX_LN_MAX_REGISTERS((backward_registers<T, W, ITEMS, MEMORY_EFFICIENT, PREFETCH>()))
    backward_in_registers(BackwardParams<T, W> p) {
  using A = Acc<T>;
  using Slice = RowSlice<T, W, ITEMS>;
  constexpr int V = Slice::V;
  __shared__ A scratch[2 * kMaxWarps];
  extern __shared__ __align__(sizeof(AlignedVector<float, 8>)) unsigned char accumulator_bytes[];
  // [blockDim.y][cols] of dgamma, then of dbeta: one region per row slot of the block.
  A* const accumulators = reinterpret_cast<A*>(accumulator_bytes);
  const int64_t slots = int64_t(blockDim.y) * p.cols;
  A* const acc_gamma = p.dgamma_parts ? accumulators + threadIdx.y * p.cols : nullptr;
  A* const acc_beta = p.dbeta_parts ? accumulators + (p.dgamma_parts ? slots : 0) + threadIdx.y * p.cols : nullptr;
  const int nthreads = blockDim.x * blockDim.y;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int acc_size = static_cast<int>(slots) * ((p.dgamma_parts ? 1 : 0) + (p.dbeta_parts ? 1 : 0));
  for (int i = tid; i < acc_size; i += nthreads) accumulators[i] = A(0);
  __syncthreads();

  const int vecs = p.cols / V;
  const auto owns = [&](int k) { return int(threadIdx.x) + k * int(blockDim.x) < vecs; };
  // Element offset, within a row, of the thread's k-th vector.
  const auto column = [&](int k) { return (int(threadIdx.x) + k * int(blockDim.x)) * V; };
  const auto load = [&](int64_t row, Slice& s) {
    if (row >= p.rows) return;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (!owns(k)) continue;
      s.x[k].load(p.x_or_y, row * p.cols + column(k));
      s.dy[k].load(p.dy, row * p.cols + column(k));
    }
    s.mean = !RMS && !MEMORY_EFFICIENT ? p.mean[row] : A(0);
    s.invvar = p.invvar[row];
  };
  const bool affine_input = MEMORY_EFFICIENT && p.beta;  // y = xhat * gamma + beta: beta is read back
  // gamma and (memory efficient) beta of element j of the thread's k-th vector, 1 and 0 when absent.
  const auto parameters = [&](int k, AlignedVector<A, V>& g, AlignedVector<A, V>& b) {
    AlignedVector<W, V> gw, bw;
    if (p.gamma) gw = load_vector<V>(p.gamma, column(k));
    if (affine_input) bw = load_vector<V>(p.beta, column(k));
#pragma unroll
    for (int j = 0; j < V; ++j) {
      g.value[j] = p.gamma ? static_cast<A>(gw.value[j]) : A(1);
      b.value[j] = affine_input ? static_cast<A>(bw.value[j]) : A(0);
    }
  };

  const int64_t stride = int64_t(gridDim.x) * blockDim.y;
  int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  Slice cur;
  load(row, cur);
  // Every block runs the same number of iterations: row_sum synchronizes the whole block.
  for (int64_t first = int64_t(blockIdx.x) * blockDim.y; first < p.rows; first += stride, row += stride) {
    Slice next;
    if constexpr (PREFETCH) load(row + stride, next);
    const bool live = row < p.rows;
    const NormalizedInput<A> normalize{cur.mean, cur.invvar, p.eps, MEMORY_EFFICIENT, p.gamma != nullptr,
                                       affine_input};

    A sums[2] = {A(0), A(0)};  // of gamma * dy and of gamma * dy * xhat
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (!live || !owns(k)) continue;
      AlignedVector<A, V> g, b;
      parameters(k, g, b);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A xhat = normalize(cur.x[k].get(j), g.value[j], b.value[j]);
        const A gdy = g.value[j] * cur.dy[k].get(j);
        sums[0] += gdy;
        sums[1] += gdy * xhat;
      }
    }
    row_sum(sums, scratch);
    const A mean_gdy = sums[0] * p.inv_cols, mean_gdy_xhat = sums[1] * p.inv_cols;

#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      cur.x[k].unpack_again_after_this();
      cur.dy[k].unpack_again_after_this();
      if (!live || !owns(k)) continue;
      AlignedVector<A, V> g, b, dgamma, dbeta;
      parameters(k, g, b);
      AlignedVector<T, V> dx;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A xhat = normalize(cur.x[k].get(j), g.value[j], b.value[j]);
        const A d = cur.dy[k].get(j);
        dx.value[j] = static_cast<T>(grad_input<RMS>(cur.invvar, g.value[j] * d, xhat, mean_gdy, mean_gdy_xhat));
        dgamma.value[j] = d * xhat;
        dbeta.value[j] = d;
      }
      store_vector<V>(p.dx, row * p.cols + column(k), dx);
      if (acc_gamma) accumulate(reinterpret_cast<AlignedVector<A, V>*>(acc_gamma + column(k)), dgamma);
      if (acc_beta) accumulate(reinterpret_cast<AlignedVector<A, V>*>(acc_beta + column(k)), dbeta);
    }
    if constexpr (PREFETCH) {
      cur = next;
    } else {
      load(row + stride, cur);
    }
  }

  // Fold the row slots and write this block's partial row.
  __syncthreads();
  for (int c = tid; c < p.cols; c += nthreads) {
    A g = A(0), b = A(0);
    for (int s = 0; s < int(blockDim.y); ++s) {
      if (p.dgamma_parts) g += accumulators[s * p.cols + c];
      if (p.dbeta_parts) b += accumulators[(p.dgamma_parts ? slots : 0) + s * p.cols + c];
    }
    if (p.dgamma_parts) p.dgamma_parts[int64_t(blockIdx.x) * p.cols + c] = g;
    if (p.dbeta_parts) p.dbeta_parts[int64_t(blockIdx.x) * p.cols + c] = b;
  }
}

// Scalar grad_input for any width and alignment: one pass for the sums, one for dx.
template <typename T, typename W, bool RMS>
__global__ void backward_streaming(BackwardParams<T, W> p) {
  using A = Acc<T>;
  __shared__ A scratch[2 * kMaxWarps];
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < p.rows;
  const int end = live ? p.cols : 0;
  const T* x = p.x_or_y + row * p.cols;
  const W* dy = p.dy + row * p.cols;
  const NormalizedInput<A> normalize =
      live ? p.normalizer(row) : NormalizedInput<A>{A(0), A(0), p.eps, false, false, false};
  const auto element = [&](int c, A& xhat, A& gdy) {
    const A g = p.gamma ? static_cast<A>(p.gamma[c]) : A(1);
    xhat = normalize(static_cast<A>(x[c]), g, p.beta ? static_cast<A>(p.beta[c]) : A(0));
    gdy = g * static_cast<A>(dy[c]);
  };

  A sums[2] = {A(0), A(0)};
  for (int c = threadIdx.x; c < end; c += blockDim.x) {
    A xhat, gdy;
    element(c, xhat, gdy);
    sums[0] += gdy;
    sums[1] += gdy * xhat;
  }
  row_sum(sums, scratch);
  const A mean_gdy = sums[0] / p.cols, mean_gdy_xhat = sums[1] / p.cols;
  for (int c = threadIdx.x; c < end; c += blockDim.x) {
    A xhat, gdy;
    element(c, xhat, gdy);
    p.dx[row * p.cols + c] = static_cast<T>(grad_input<RMS>(normalize.invvar, gdy, xhat, mean_gdy, mean_gdy_xhat));
  }
}

// Parameter grads for the scalar path: block (kFoldColumns, kFoldRows) sums a column strip over
// a chunk of rows; blockIdx.y picks the chunk, which is also the partial row written.
template <typename T, typename W>
__global__ void parameter_grads_by_columns(BackwardParams<T, W> p, int64_t rows_per_chunk) {
  using A = Acc<T>;
  const int c = blockIdx.x * kFoldColumns + threadIdx.x;
  const int64_t first = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t last = min(first + rows_per_chunk, p.rows);
  A dgamma = A(0), dbeta = A(0);
  if (c < p.cols) {
    const A g = p.gamma ? static_cast<A>(p.gamma[c]) : A(1);
    const A b = p.beta ? static_cast<A>(p.beta[c]) : A(0);
    for (int64_t r = first + threadIdx.y; r < last; r += kFoldRows) {
      const A d = static_cast<A>(p.dy[r * p.cols + c]);
      dgamma += d * p.normalizer(r)(static_cast<A>(p.x_or_y[r * p.cols + c]), g, b);
      dbeta += d;
    }
  }
  dgamma = column_sum(dgamma);
  __syncthreads();  // column_sum's buffer is reused
  dbeta = column_sum(dbeta);
  if (threadIdx.y == 0 && c < p.cols) {
    if (p.dgamma_parts) p.dgamma_parts[blockIdx.y * int64_t(p.cols) + c] = dgamma;
    if (p.dbeta_parts) p.dbeta_parts[blockIdx.y * int64_t(p.cols) + c] = dbeta;
  }
}

// Independent partial sums per thread in sum_partial_rows: that many loads in flight each.
constexpr int kSumUnroll = 4;

// The parameter grads from the partial rows: out_k[c] = sum over r of parts[k][r][c], k = blockIdx.y
// (dgamma, then dbeta when both are wanted), all in one launch.
template <typename A, typename W>
__global__ void sum_partial_rows(const A* parts, int64_t num_parts, int cols, W* out0, W* out1) {
  const int c = blockIdx.x * kFoldColumns + threadIdx.x;
  const A* column_parts = parts + blockIdx.y * num_parts * cols + c;
  A totals[kSumUnroll] = {};
  if (c < cols) {
    int64_t r = threadIdx.y;
    for (; r + (kSumUnroll - 1) * kFoldRows < num_parts; r += kSumUnroll * kFoldRows) {
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) totals[u] += column_parts[(r + u * kFoldRows) * cols];
    }
    for (; r < num_parts; r += kFoldRows) totals[0] += column_parts[r * cols];
  }
  A total = A(0);
#pragma unroll
  for (int u = 0; u < kSumUnroll; ++u) total += totals[u];
  total = column_sum(total);
  W* out = blockIdx.y == 0 ? out0 : out1;
  if (threadIdx.y == 0 && c < cols) out[c] = static_cast<W>(total);
}

template <typename T, typename W>
void backward_typed(const Cuda& device, const BackwardArgs& a, const Scratch& scratch) {
  using A = Acc<T>;
  constexpr int V = vector_width<T>();
  BackwardParams<T, W> p{static_cast<const W*>(a.grad_output),
                         static_cast<const T*>(a.input_or_output),
                         a.rms ? nullptr : static_cast<const A*>(a.mean),
                         static_cast<const A*>(a.invvar),
                         static_cast<const W*>(a.weight),
                         static_cast<const W*>(a.bias),
                         static_cast<T*>(a.grad_input),
                         nullptr,
                         nullptr,
                         a.rows,
                         static_cast<int>(a.cols),
                         A(1) / static_cast<A>(a.cols),
                         static_cast<A>(a.eps),
                         a.memory_efficient};
  const bool want_dgamma = a.grad_weight != nullptr, want_dbeta = a.grad_bias != nullptr;
  const int accumulators = int(want_dgamma) + int(want_dbeta);
  const cuda::DeviceLimits& limits = cuda::device_limits(device.device);
  const cudaStream_t stream = cuda::stream(device);
  // [accumulators, parts, cols]: dgamma's partial rows, then dbeta's.
  int64_t num_parts = 0;
  const auto allocate_parts = [&](int64_t parts) {
    num_parts = parts;
    if (accumulators == 0) return;
    A* base = static_cast<A*>(scratch(sizeof(A) * size_t(accumulators) * size_t(parts) * size_t(a.cols)));
    p.dgamma_parts = want_dgamma ? base : nullptr;
    p.dbeta_parts = want_dbeta ? base + (want_dgamma ? parts * a.cols : 0) : nullptr;
  };

  constexpr size_t kInputAlignment = alignof(AlignedVector<T, V>), kGradAlignment = alignof(AlignedVector<W, V>);
  const bool vectorizable = !std::is_same_v<T, double> && a.cols % V == 0 && is_aligned(p.x_or_y, kInputAlignment) &&
                            is_aligned(p.dx, kInputAlignment) && is_aligned(p.dy, kGradAlignment) &&
                            is_aligned(p.gamma, kGradAlignment) && is_aligned(p.beta, kGradAlignment);
  std::optional<RowLayout> layout =
      vectorizable ? register_layout(a.cols / V, limits.warp_size, kMaxRegisterRowThreads, kMaxBackwardElements / V,
                                     kBackwardItems)
                   : std::nullopt;
  const size_t smem = layout ? size_t(layout->rows_per_block) * a.cols * sizeof(A) * accumulators : 0;
  // Leave room for the kernels' static shared memory (the row reduction's scratch).
  if (smem + 1024 > limits.shared_per_block_optin) layout.reset();
  // Prefetching holds a second row slice in registers. It pays only where the accumulators leave
  // shared memory for a single block per SM (wide LayerNorm rows): there the registers cost no
  // occupancy, and no other block is around to overlap this one's reductions with loads.
  const bool one_block_per_sm = smem > 0 && 2 * (smem + limits.reserved_shared_per_block) > limits.shared_per_sm;

  if (layout) {
    if constexpr (!std::is_same_v<T, double>) {
      const dim3 block(layout->threads_per_row, layout->rows_per_block);
      const int64_t row_blocks = (a.rows + layout->rows_per_block - 1) / layout->rows_per_block;
      // The persistent grid: as many blocks as are resident at once, at most one per block of rows.
      const auto launch = [&](auto kernel) {
        const int per_sm = cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), block.x * block.y,
                                                        smem, device.device);
        const int64_t blocks = std::min<int64_t>(row_blocks, int64_t(per_sm) * limits.sms);
        allocate_parts(blocks);
        kernel<<<blocks, block, smem, stream>>>(p);
      };
      dispatch_bool(a.rms, [&](auto rms) {
        constexpr bool kRms = decltype(rms)::value;
        dispatch_bool(a.memory_efficient, [&](auto memory_efficient) {
          constexpr bool kMemoryEfficient = decltype(memory_efficient)::value;
          dispatch_items(layout->items, [&](auto items) {
            constexpr int kItems = std::min(decltype(items)::value, kMaxBackwardElements / V);
            // Only rows wider than kBackwardItems vectors per thread reach one block per SM, so
            // narrower instances are not compiled with prefetch (they would never be chosen).
            constexpr bool kCanPrefetch = !kMemoryEfficient && kItems > kBackwardItems &&
                                          kItems * V * (sizeof(T) + sizeof(W)) <= kMaxPrefetchSliceBytes;
            if (kCanPrefetch && one_block_per_sm) {
              launch(backward_in_registers<T, W, kItems, kRms, kMemoryEfficient, kCanPrefetch>);
            } else {
              launch(backward_in_registers<T, W, kItems, kRms, kMemoryEfficient, false>);
            }
          });
        });
      });
    }
  } else {
    const RowLayout shape = streaming_layout(a.cols, limits.warp_size);
    const int64_t blocks = (a.rows + shape.rows_per_block - 1) / shape.rows_per_block;
    dispatch_bool(a.rms, [&](auto rms) {
      backward_streaming<T, W, decltype(rms)::value>
          <<<blocks, dim3(shape.threads_per_row, shape.rows_per_block), 0, stream>>>(p);
    });
    if (accumulators > 0) {
      const int64_t column_blocks = (a.cols + kFoldColumns - 1) / kFoldColumns;
      // Enough row chunks to give every SM a few blocks, each chunk at least kFoldRows rows.
      const int64_t wanted = std::max<int64_t>(1, 4 * limits.sms / column_blocks);
      const int64_t chunks = std::min<int64_t>(wanted, (a.rows + kFoldRows - 1) / kFoldRows);
      const int64_t rows_per_chunk = (a.rows + chunks - 1) / chunks;
      allocate_parts(chunks);
      parameter_grads_by_columns<T, W>
          <<<dim3(column_blocks, chunks), dim3(kFoldColumns, kFoldRows), 0, stream>>>(p, rows_per_chunk);
    }
  }

  if (accumulators > 0) {
    W* first = static_cast<W*>(want_dgamma ? a.grad_weight : a.grad_bias);
    W* second = accumulators == 2 ? static_cast<W*>(a.grad_bias) : nullptr;
    const dim3 grid((a.cols + kFoldColumns - 1) / kFoldColumns, accumulators);
    const A* parts = want_dgamma ? p.dgamma_parts : p.dbeta_parts;
    sum_partial_rows<A, W><<<grid, dim3(kFoldColumns, kFoldRows), 0, stream>>>(parts, num_parts,
                                                                              static_cast<int>(a.cols), first, second);
  }
  cuda::check_launch(a.rms ? "rms_norm_bwd" : "layer_norm_bwd");
}

}  // namespace apex::layer_norm
