#pragma once
// LayerNorm / RMSNorm backward on CUDA: the kernels and backward_typed<T, W, RMS>, which
// layer_norm_backward_<dtypes>[_rms].cu instantiate, one dtype pair and norm each (so that ninja
// compiles them in parallel: all pairs in one file took 83 s, one pair of both norms ~12 s of device
// compile after the fused kernel's specialisations), and layer_norm_backward.cu dispatches to. The
// 16-bit pairs' fused launches (launch_fused) are split further, into
// layer_norm_backward_fused[4]_<dtype>[_rms].cu (see the `extern template` declarations).
//
// grad_input needs two sums per row (of g*dy and of g*dy*xhat); grad_weight / grad_bias are
// sums over rows. The register-resident kernels keep each row in registers (as loaded, 16-bit
// elements two to a register), so x (or y) and dy are read once and dx written once; a persistent
// grid lets every block add its rows' dy*xhat and dy into per-block fp32 accumulators in shared
// memory (each thread owns its columns: no atomics), written out once as one partial row per block.
// One small launch then sums the partial rows of both parameter grads. Rows that cannot be
// vectorized take scalar kernels (two passes per row, and a column kernel for the parameter
// grads that re-reads the inputs).
//
// Two register-resident kernels. backward_fused is the one that runs (see its comment for what it
// saves per element): on an H200 (bench_norms.py --impls apex, bf16) its backward alone was 1.05-1.33x
// faster than backward_in_registers' (LayerNorm 4096x16384: 0.173 -> 0.130 ms), and it also beat
// gamma held in registers instead of shared memory (LayerNorm 8192x8192 fwd+bwd: 70.1 % of copy
// against 82.0 %) and prefetching the next row everywhere instead of only where one block fills an
// SM (8192x5120: 68.6 % against 76.4 %); both were dropped. backward_in_registers, the kernel
// before it, remains for what backward_fused does not do: the memory-efficient backward (y, not x)
// and rows whose gamma copy leaves no room in shared memory (backward_typed).

#include <cstring>

#include "apex/packed_pairs.cuh"
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
  cuda::start_dependent_kernel();
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

// ---------------------------------------------------------------------------------------------
// backward_fused: the register-resident backward with fewer instructions per element.
//
// Why: on an H200 the kernel above issued ~38 thread-instructions per bf16 element (ncu), while
// copy speed leaves ~48 per element at 100 % of the SM's issue rate; at 8 warps per scheduler it
// sat at 60 % issue and 60-75 % of DRAM bandwidth. Per element it reloaded and unpacked gamma in
// both passes, did a shared-memory read-modify-write of the parameter-grad accumulators that kept
// the products separate from the adds, recomputed xhat as (x - mean) * invvar, formed dx by
// separate multiplies and subtracts, converted each output on its own, and reduced each row with
// runtime-bounded shuffle loops and two barriers. Here, per element (bf16, LayerNorm):
//   pass 1 (sums)  unpack x, dy; xhat = fma(x, invvar, -mean*invvar); gdy = g*dy; s0 += gdy;
//                  s1 = fma(gdy, xhat, s1)                                     6 instructions
//   pass 2 (dx)    unpack x, dy; xhat; dx = fma(g*dy, invvar, fma(xhat, c2, c1)) (3);
//                  dgamma = fma(dy, xhat, dgamma); dbeta += dy; half a cvt packing two outputs;
//                  a quarter of a 16-byte LDS and STS each for dgamma and dbeta  9.5 instructions
// gamma is converted to float once per kernel (a copy in shared memory: one 16-byte LDS per 4
// elements and pass on top of the above), a row's two sums take one barrier (row_sum2), each
// address is one 64-bit add from a per-thread pointer, and vectors past the row end need no
// branches. SASS (sm_90, CUDA 13), one thread's path through one row, bf16:
//   LayerNorm, both grads, 2 vectors per thread (4096 columns)  575 -> 372 (35.9 -> 23.3 per element),
//                                                               64 registers both
//   RMSNorm, 2 vectors per thread                               507 -> 348 (31.7 -> 21.8), 64 both
//   LayerNorm, 4 vectors per thread, prefetching (16384)        1116 -> 680 (34.9 -> 21.3),
//                                                               112 -> 128 registers (1 block/SM both)

// Row barriers (backward_fused's ROW_BARRIERS, fused_row_barriers): 16-bit rows (T and W alike) at
// kBackwardItems vectors per thread (512-8192 bf16 columns) run in blocks of up to kMaxThreads threads
// (one per SM at 64 registers: the same warps per SM as several 256-thread blocks), whose row slots
// each synchronize on a named barrier of their own instead of the whole block: 15 slots of 64 threads
// at 1024 columns, 4 of 256 at 4096, 3 of 320 at 5120, 2 of 512 at 8192. A block writes one partial
// row per SM instead of one per 256 threads (2-4x less partial-row traffic and a smaller fold), and a
// slot no longer waits on the others at each row. H200, bf16, fwd+bwd % of copy, before -> after:
// LayerNorm 16384x4096 83.8 -> 92.3, 8192x5120 81.2 -> 86.2, 8192x8192 86.2 -> 89.3, 32768x1024
// 85.1 -> 86.0, 4096x16384 (4 vectors per thread, not row barriers) 80.6 both; RMSNorm 8192x5120
// 86.7 -> 87.8, 8192x8192 90.4 -> 91.1, 32768x1024 86.9 -> 86.7, 16384x4096 91.6 -> 90.7 (noise
// level). Two other shapes lost in the same A/B (benchmarks/normalization/NOTES.md, session 29): two
// rows per row slot (80 registers, 3 blocks per SM) and rows over 8192 columns on 1024 threads at
// 2 vectors each.

// Named barriers of a block on sm_90: 16, of which 0 is __syncthreads'; row barriers give row slot
// y barrier y + 1, so a block holds at most this many row slots that need one.
constexpr int kMaxNamedRowBarriers = 15;

// Whether backward_fused takes row barriers for this dtype pair at ITEMS vectors per thread (see
// above); not on ROCm (bar.sync with a thread count).
template <typename T, typename W, int ITEMS>
constexpr bool fused_row_barriers() {
#if defined(USE_ROCM)
  return false;
#else
  return sizeof(T) == 2 && std::is_same_v<T, W> && ITEMS == kBackwardItems;
#endif
}

// Registers backward_fused needs beyond its row data (addresses, the row's statistics and
// sums, loop state, one chunk's temporaries, and the next row's vector loaded while the current
// row's last one is worked on): the least that keeps ptxas -v free of spills (sm_90, CUDA 13) at
// 2 bf16 vectors per thread, so that kernel fits 64 registers, as backward_in_registers did.
constexpr int kFusedRegisterOverhead = 48;
// ... and per vector beyond kBackwardItems per thread (their addresses and ownership tests).
constexpr int kFusedRegistersPerExtraVector = 8;
// ... and with PREFETCH (the second slice's statistics and addresses): bf16 at 4 vectors per thread
// reaches the 128-register limit (a few bytes of loop-invariant spills), at 2 vectors 104 registers.
constexpr int kFusedPrefetchOverhead = 72;

// Whether a backward_fused instance may prefetch: both row slices (x and dy bytes) together stay
// within what the old kernel allowed (kMaxPrefetchSliceBytes), so bf16 at 4 vectors per thread
// (the one-block-per-SM rows) and 16-bit data at 2, not fp32 pairs or mixed dtypes beyond 2.
template <typename T, typename W, int ITEMS>
constexpr bool fused_can_prefetch() {
  return ITEMS * vector_width<T>() * (sizeof(T) + sizeof(W)) <= kMaxPrefetchSliceBytes;
}

// Register cap of a backward_fused instance: its row data (twice when prefetching) plus the above.
template <typename T, typename W, int ITEMS, bool PREFETCH>
constexpr int fused_registers() {
  constexpr int kData = ITEMS * vector_width<T>() * int(sizeof(T) + sizeof(W)) / 4 * (PREFETCH ? 2 : 1);
  constexpr int kExtraVectors = ITEMS > kBackwardItems ? ITEMS - kBackwardItems : 0;
  constexpr int kOverhead =
      PREFETCH ? kFusedPrefetchOverhead : kFusedRegisterOverhead + kFusedRegistersPerExtraVector * kExtraVectors;
  constexpr int kWanted = (kData + kOverhead + 7) / 8 * 8;
  return kWanted > kMaxRegistersPerThread ? kMaxRegistersPerThread : kWanted;
}

// Elements 4h .. 4h + 3 of a packed vector in float (h a compile-time constant after unrolling):
// one instruction each for 16-bit T, none for float. Unpacked where used, a chunk at a time, so
// that few of a row's elements are live in float at once.
template <typename T, int V>
__device__ __forceinline__ void unpack_chunk(const PackedVector<T, V>& packed, int h, float (&out)[4]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(packed.word[4 * h + i]);
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 two = unpack_pair<T>(packed.word[2 * h + i]);
      out[2 * i] = two.x;
      out[2 * i + 1] = two.y;
    }
  }
}

// Sums s0 and s1 over the blockDim.x threads of a row (threadIdx.y picks the row); every thread of
// the row gets both totals. blockDim.x: a power of two up to a warp, else whole warps, at most
// kMaxRegisterRowThreads (two values per warp must fit in one warp). WHOLE_WARPS: the caller knows
// blockDim.x >= C10_WARP_SIZE (every layout with 2+ vectors per thread), so the warp steps are
// fixed. Must be reached by every thread of the block.
//
// Cheaper than row_sum<2> (layer_norm_cuda.cuh) for the same result: the first shuffle step swaps
// halves, so that the lower half of each row-in-a-warp carries s0 and the upper half s1, and the
// remaining steps shuffle one value instead of two (a full warp: 2 selects + 5 shuffles and adds,
// not 10 of each); the warps' totals are read as one value per lane (lane 2w + k: sum k of warp w)
// and folded in 4 steps. The caller alternates between two scratch buffers from one row to the next
// (`buffer`: one of them), so one barrier per row suffices: a buffer is written again only two
// rows later, after every thread has passed the barrier of the row between, hence has finished
// reading it.
//
// NAMED: the row slot's threads synchronize on named barrier threadIdx.y + 1 (row_barrier), not the
// whole block.
template <bool NAMED>
__device__ __forceinline__ void row_barrier() {
#if !defined(USE_ROCM)
  if constexpr (NAMED) {
    asm volatile("bar.sync %0, %1;" ::"r"(threadIdx.y + 1), "r"(blockDim.x) : "memory");
    return;
  }
#endif
  __syncthreads();
}

template <bool WHOLE_WARPS, bool NAMED = false>
__device__ __forceinline__ void row_sum2(float& s0, float& s1, float* buffer /* this row's of the two */) {
  constexpr int kWarp = C10_WARP_SIZE;
  static_assert(kMaxRegisterRowThreads / kWarp * 2 <= kWarp, "two values per warp in one warp");
  const int width = WHOLE_WARPS ? kWarp : (blockDim.x < kWarp ? blockDim.x : kWarp);
  if (!WHOLE_WARPS && width == 1) return;
  const int half = width / 2;
  const bool upper = (threadIdx.x & half) != 0;
  float keep = upper ? s1 : s0;
  keep += shuffle_xor(upper ? s0 : s1, half);
#pragma unroll
  for (int offset = kWarp / 4; offset > 0; offset /= 2) {
    if (WHOLE_WARPS || offset < half) keep += shuffle_xor(keep, offset);
  }
  if (blockDim.x <= kWarp) {  // the row within one warp: its lanes first and first + half hold s0, s1
    const int lane = (threadIdx.y * blockDim.x + threadIdx.x) % kWarp;
    const int first = lane & ~(width - 1);  // the lane of the row's first thread
#if defined(USE_ROCM)
    s0 = __shfl(keep, first);
    s1 = __shfl(keep, first + half);
#else
    s0 = __shfl_sync(0xffffffffu, keep, first);
    s1 = __shfl_sync(0xffffffffu, keep, first + half);
#endif
    return;
  }
  // Several warps per row (blockDim.x a multiple of the warp): lanes 0 and half hold the warp's s0, s1.
  const int lane = threadIdx.x % kWarp;
  const int warps = blockDim.x / kWarp;
  float* const row_scratch = buffer + threadIdx.y * 2 * warps;
  if ((lane & (half - 1)) == 0) row_scratch[(threadIdx.x / kWarp) * 2 + (upper ? 1 : 0)] = keep;
  row_barrier<NAMED>();
  float v = lane < 2 * warps ? row_scratch[lane] : 0.0f;
#pragma unroll
  for (int offset = kWarp / 2; offset > 1; offset /= 2) v += shuffle_xor(v, offset);
#if defined(USE_ROCM)
  s0 = __shfl(v, 0);
  s1 = __shfl(v, 1);
#else
  s0 = __shfl_sync(0xffffffffu, v, 0);
  s1 = __shfl_sync(0xffffffffu, v, 1);
#endif
}

// float4 chunks of one row slot's accumulators (and of the shared gamma copy) in backward_fused:
// each of the threads_per_row threads has ITEMS vectors of V / 4 chunks. Chunk c (= k * V/4 + h:
// elements 4h .. 4h+3 of the thread's k-th vector) of thread t sits at c * threads_per_row + t,
// so the threads of a warp touch consecutive 16 bytes (no bank conflicts) and a thread reaches all
// of its chunks from one address plus multiples of a block-uniform stride (no per-chunk address
// registers). Chunks of vectors past the row end are unused.
template <typename T>
inline int64_t fused_region_chunks(int items, int threads_per_row) {
  return int64_t(items) * (vector_width<T>() / 4) * threads_per_row;
}

// Sum of a block's row slots of one region (slot s at s * region): its chunk i.
__device__ __forceinline__ float4 slot_sum(const float4* slot0, int region, int slots, int i) {
  float4 sum = slot0[i];
  for (int s = 1; s < slots; ++s) {
    const float4 more = slot0[s * region + i];
    sum.x += more.x, sum.y += more.y, sum.z += more.z, sum.w += more.w;
  }
  return sum;
}

// Register-resident backward over a persistent grid, like backward_in_registers (same layout, same
// partial rows; rows go to row slots slot-major, see below), with the per-element work of the comment
// above. Shared memory holds, in float4 chunks laid out as fused_region_chunks says: gamma (one copy
// for the block, in float), then blockDim.y row slots of dgamma accumulators, then as many of dbeta
// (each only when wanted).
// PREFETCH loads the thread's next row before working on the current one (two row slices in
// registers, processed in turn, no copies between them); without it a thread reloads each vector
// as soon as its dx is written. x_or_y holds x (never the memory-efficient y).
// ROW_BARRIERS: each row slot synchronizes on a named barrier of its own (row_sum2), so that a block
// may hold up to kMaxThreads threads of row slots (see "Row barriers" above); without it row_sum2
// synchronizes the whole block.
template <typename T, typename W, int ITEMS, bool RMS, bool PREFETCH, bool ROW_BARRIERS = false>
__global__ void APEX_LN_MAX_REGISTERS((fused_registers<T, W, ITEMS, PREFETCH>()))
    backward_fused(BackwardParams<T, W> p) {
  cuda::start_dependent_kernel();
  static_assert(std::is_same_v<Acc<T>, float>, "16-bit and float32 data");
  using Slice = RowSlice<T, W, ITEMS>;
  constexpr int V = Slice::V;
  constexpr int kChunks = V / 4;  // float4 chunks of one vector
  constexpr int kThreadChunks = ITEMS * kChunks;
  // 2+ vectors per thread only where a row fills a warp (register_layout), so row_sum2's steps are fixed.
  constexpr bool kWholeWarps = ITEMS > 1;
  // xhat = x * invvar + shift (one FFMA) where the rounding of shift = -mean * invvar, |mean| * invvar
  // * 2^-24, is far below the input's own (|x| * invvar * 2^-8 for bf16, 2^-11 for fp16); for fp32
  // data it is not, so fp32 keeps (x - mean) * invvar.
  constexpr bool kShiftForm = sizeof(T) == 2;
  __shared__ float scratch[2][2 * kMaxWarps];  // row_sum2's two buffers
  extern __shared__ __align__(16) unsigned char fused_shared_bytes[];
  float4* const shared = reinterpret_cast<float4*>(fused_shared_bytes);

  const int vecs = p.cols / V;
  const int region = kThreadChunks * blockDim.x;  // fused_region_chunks
  const bool want_dgamma = p.dgamma_parts != nullptr, want_dbeta = p.dbeta_parts != nullptr;
  float4* const accumulators = shared + region;
  const int slots = blockDim.y;
  const int nthreads = blockDim.x * blockDim.y;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int acc_chunks = slots * region * (int(want_dgamma) + int(want_dbeta));
  // Column of chunk index i of a region, or -1 for chunks of vectors past the row end.
  const auto chunk_column = [&](int i) {
    const int c = i / blockDim.x, t = i - c * blockDim.x;
    const int v = t + (c / kChunks) * blockDim.x;
    return v < vecs ? v * V + (c % kChunks) * 4 : -1;
  };
  for (int i = tid; i < acc_chunks; i += nthreads) accumulators[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  // The block's gamma copy in float, 1 without gamma (one code path: the multiply by 1 is cheaper
  // than a second copy of the loop).
  for (int i = tid; i < region; i += nthreads) {
    const int c = chunk_column(i);
    float4 g = make_float4(1.f, 1.f, 1.f, 1.f);
    if (p.gamma && c >= 0) {
      g = make_float4(float(p.gamma[c]), float(p.gamma[c + 1]), float(p.gamma[c + 2]), float(p.gamma[c + 3]));
    }
    shared[i] = g;
  }
  __syncthreads();

  const auto vector_index = [&](int k) { return int(threadIdx.x) + k * int(blockDim.x); };
  const auto owns = [&](int k) { return vector_index(k) < vecs; };

  // This thread's chunk 0 of gamma and of the accumulators; chunk c is c * blockDim.x further.
  const float4* const my_gamma = shared + threadIdx.x;
  float4* const my_dgamma = accumulators + threadIdx.y * region + threadIdx.x;
  float4* const my_dbeta = accumulators + ((want_dgamma ? slots : 0) + threadIdx.y) * region + threadIdx.x;
  // gamma of chunk h (elements 4h .. 4h + 3) of the thread's k-th vector.
  const auto gamma_chunk = [&](int k, int h, float (&g)[4]) {
    const float4 four = my_gamma[(k * kChunks + h) * blockDim.x];
    g[0] = four.x, g[1] = four.y, g[2] = four.z, g[3] = four.w;
  };

  // Addresses. A thread follows one pointer: x at its vector 0 of the current row. Its other
  // vectors are k * vector_step bytes on, and dy (same element size) and dx are at block-uniform
  // byte distances from x, which live in uniform registers: every other address costs one 64-bit
  // add and no registers (recomputing row * cols + column for each took ~3 instructions per
  // element).
  constexpr bool kSameSize = sizeof(W) == sizeof(T);
  const int64_t vector_step = int64_t(blockDim.x) * V * int64_t(sizeof(T));
  const int64_t row_step = int64_t(gridDim.x) * blockDim.y * p.cols * int64_t(sizeof(T));
  const int64_t dx_distance = reinterpret_cast<intptr_t>(p.dx) - reinterpret_cast<intptr_t>(p.x_or_y);
  const int64_t dy_distance = reinterpret_cast<intptr_t>(p.dy) - reinterpret_cast<intptr_t>(p.x_or_y);
  const auto at = [](const void* base, int64_t bytes) {
    return reinterpret_cast<const char*>(base) + bytes;
  };
  // dy of the element whose x is at x_address (a 64-bit add; mixed dtypes: twice the x offset).
  const auto dy_address = [&](const char* x_address) -> const void* {
    if constexpr (kSameSize) return x_address + dy_distance;
    return at(p.dy, (x_address - reinterpret_cast<const char*>(p.x_or_y)) * int64_t(sizeof(W) / sizeof(T)));
  };
  const auto load_vector_k = [&](const char* x_row, int k, Slice& s) {
    const char* const x_address = x_row + k * vector_step;
    s.x[k].load(reinterpret_cast<const T*>(x_address), 0);
    s.dy[k].load(reinterpret_cast<const W*>(dy_address(x_address)), 0);
  };
  const auto load_statistics = [&](int64_t row, Slice& s) {
    s.mean = RMS ? 0.f : p.mean[row];
    s.invvar = p.invvar[row];
  };
  const auto load = [&](int64_t row, const char* x_row, Slice& s) {
    if (row >= p.rows) return;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (owns(k)) load_vector_k(x_row, k, s);
    }
    load_statistics(row, s);
  };

  const int64_t stride = int64_t(gridDim.x) * blockDim.y;
  // Rows go to row slots slot-major: row k * stride + y * gridDim.x + b for slot y of block b, so that
  // a last, partial round of rows spreads over every block (every SM) instead of filling the first
  // blocks' slots and leaving the rest idle: max rows per SM 255 -> 249 at 32768x1024 (15 slots), 128 ->
  // 125 at 16384x4096. On an H200 (bf16 fwd+bwd GB/s) RMSNorm 16384x4096 3857 -> 3966 and 32768x1024
  // 3689 -> 3760 against block-major rows (row k * stride + b * blockDim.y + y), the other LayerNorm and
  // RMSNorm shapes -0.1 to +0.4 % (benchmarks/normalization/NOTES.md, session 31).
  // `first`, the block's least row of the round, is the loop bound: the same for all its slots.
  int64_t first = blockIdx.x;
  const int64_t first_row = int64_t(threadIdx.y) * gridDim.x + blockIdx.x;
  const char* const first_x = at(p.x_or_y, (first_row * p.cols + vector_index(0) * V) * int64_t(sizeof(T)));

  // The row loop, for one combination of wanted parameter grads (compile-time, so that nothing
  // about the absent ones is computed per element).
  const auto rows = [&](auto dgamma_wanted, auto dbeta_wanted) {
    constexpr bool kDgamma = decltype(dgamma_wanted)::value, kDbeta = decltype(dbeta_wanted)::value;
    // A row's statistics and its xhat (from the raw x).
    struct Normalizer {
      float invvar, mean, shift;
      __device__ __forceinline__ float operator()(float x) const {
        if constexpr (RMS) return x * invvar;
        if constexpr (kShiftForm) return fmaf(x, invvar, shift);
        return (x - mean) * invvar;
      }
    };
    const auto normalizer = [](const Slice& s) { return Normalizer{s.invvar, s.mean, -s.mean * s.invvar}; };

    // Pass 1 of a live row: its thread's parts of the sums of gamma * dy and of gamma * dy * xhat.
    // Both passes work on every vector of the slice, owned or not: a vector past the row end is
    // never loaded and stays zero (the slice starts zeroed), so it adds 0 to the sums and to its
    // (unused) accumulator chunks; only its dx store is skipped. A branch per vector and pass,
    // with its convergence barrier, cost more than that. A row past the end (the last iteration of
    // some row slots) skips both passes: its data is a stale row's.
    const auto sums = [&](const Slice& s, const Normalizer& normalized, float& s0, float& s1) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
        for (int h = 0; h < kChunks; ++h) {
          float g[4], x[4], d[4];
          gamma_chunk(k, h, g);
          unpack_chunk(s.x[k], h, x);
          unpack_chunk(s.dy[k], h, d);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float gdy = g[i] * d[i];
            s0 += gdy;
            s1 = fmaf(gdy, normalized(x[i]), s1);
          }
        }
      }
    };

    // Pass 2 of a live row, given the row's totals s0, s1: dx and the parameter-grad terms. Without
    // PREFETCH it also reloads `s` with the vectors of row `next` (x at next_x) as each is done; the
    // caller reloads the statistics (reload_statistics).
    const auto finish = [&](Slice& s, const Normalizer& normalized, const char* x_row, float s0, float s1,
                            int64_t next, const char* next_x) {
      const float invvar = normalized.invvar;
      // dx = invvar * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)) = fma(g*dy, invvar, fma(xhat, c2, c1)).
      const float c2 = -invvar * (s1 * p.inv_cols);
      const float c1 = RMS ? 0.f : -invvar * (s0 * p.inv_cols);
      const char* const dx_row = x_row + dx_distance;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        // Unpack again rather than keep pass 1's floats live across the reduction.
        s.x[k].unpack_again_after_this();
        s.dy[k].unpack_again_after_this();
        AlignedVector<uint32_t, V * int(sizeof(T)) / 4> out;  // dx as stored
#pragma unroll
        for (int h = 0; h < kChunks; ++h) {
          float g[4], x[4], d[4], dx[4];
          gamma_chunk(k, h, g);
          unpack_chunk(s.x[k], h, x);
          unpack_chunk(s.dy[k], h, d);
          const int chunk = (k * kChunks + h) * blockDim.x;
          float4 dgamma, dbeta;
          if constexpr (kDgamma) dgamma = my_dgamma[chunk];
          if constexpr (kDbeta) dbeta = my_dbeta[chunk];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float xhat = normalized(x[i]);
            dx[i] = fmaf(g[i] * d[i], invvar, fmaf(xhat, c2, c1));
            if constexpr (kDgamma) (&dgamma.x)[i] = fmaf(d[i], xhat, (&dgamma.x)[i]);
            if constexpr (kDbeta) (&dbeta.x)[i] += d[i];
          }
          if constexpr (kDgamma) my_dgamma[chunk] = dgamma;
          if constexpr (kDbeta) my_dbeta[chunk] = dbeta;
          if constexpr (sizeof(T) == 2) {
            out.value[2 * h] = pack_pair<T>(dx[0], dx[1]);
            out.value[2 * h + 1] = pack_pair<T>(dx[2], dx[3]);
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) out.value[4 * h + i] = __float_as_uint(dx[i]);
          }
        }
        if (owns(k)) *reinterpret_cast<decltype(out)*>(const_cast<char*>(dx_row + k * vector_step)) = out;
        // The next row's vector k as soon as this one is done with it (a row past the end has
        // no next row, so nothing is lost by skipping this for it).
        if constexpr (!PREFETCH) {
          if (next < p.rows && owns(k)) load_vector_k(next_x, k, s);
        }
      }
    };
    const auto reload_statistics = [&](Slice& s, int64_t next) {
      if constexpr (!PREFETCH) {
        if (next < p.rows) load_statistics(next, s);
      }
    };

    // One row: sums, reduction, dx and the parameter-grad terms; `s` then holds row + stride
    // (without PREFETCH).
    const auto process = [&](Slice& s, int64_t row, const char* x_row, int parity) {
      const bool live = row < p.rows;
      const Normalizer normalized = normalizer(s);
      float s0 = 0.f, s1 = 0.f;  // of gamma * dy and of gamma * dy * xhat
      if (live) sums(s, normalized, s0, s1);
      row_sum2<kWholeWarps, ROW_BARRIERS>(s0, s1, scratch[parity]);
      if (live) finish(s, normalized, x_row, s0, s1, row + stride, x_row + row_step);
      reload_statistics(s, row + stride);
    };

    // Every block runs the same number of iterations: row_sum2 synchronizes the whole block (with
    // ROW_BARRIERS, each row slot).
    int64_t row = first_row;
    const char* x_row = first_x;
    if constexpr (PREFETCH) {
      Slice a{}, b{};  // zeros: see sums()
      load(row, x_row, a);
      while (first < p.rows) {
        load(row + stride, x_row + row_step, b);
        process(a, row, x_row, 0);
        first += stride, row += stride, x_row += row_step;
        if (first >= p.rows) break;
        load(row + stride, x_row + row_step, a);
        process(b, row, x_row, 1);
        first += stride, row += stride, x_row += row_step;
      }
    } else {
      Slice s{};  // zeros: see sums()
      load(row, x_row, s);
      for (int parity = 0; first < p.rows; first += stride, row += stride, x_row += row_step, parity ^= 1) {
        process(s, row, x_row, parity);
      }
    }
  };
  if (want_dgamma && want_dbeta && !RMS) {
    rows(std::true_type{}, std::true_type{});
  } else if (want_dgamma) {
    rows(std::true_type{}, std::false_type{});
  } else if (want_dbeta && !RMS) {  // RMSNorm has no bias
    rows(std::false_type{}, std::true_type{});
  } else {
    rows(std::false_type{}, std::false_type{});
  }

  // Fold the row slots and write this block's partial rows.
  __syncthreads();
  const int64_t part = int64_t(blockIdx.x) * p.cols;
  const float4* const beta = accumulators + (want_dgamma ? slots : 0) * region;
  for (int i = tid; i < region; i += nthreads) {
    const int c = chunk_column(i);
    if (c < 0) continue;
    if (want_dgamma) *reinterpret_cast<float4*>(p.dgamma_parts + part + c) = slot_sum(accumulators, region, slots, i);
    if (want_dbeta) *reinterpret_cast<float4*>(p.dbeta_parts + part + c) = slot_sum(beta, region, slots, i);
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
  cuda::start_dependent_kernel();
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

// What the launches of the register-resident backwards (backward_fused, backward_in_registers) share:
// the persistent grid, as many blocks as are resident at once, at most one per block of rows
// (threads.y row slots), each block writing one partial row of each parameter grad into scratch.
template <typename T, typename W>
struct PersistentLaunch {
  const Cuda& device;
  const cuda::DeviceLimits& limits;
  cudaStream_t stream;
  BackwardParams<T, W>& p;
  const Scratch& scratch;
  RowLayout layout;
  int64_t rows;
  int64_t cols;
  bool want_dgamma, want_dbeta;
  int64_t num_parts = 0;  // partial rows per parameter grad, once launched

  int accumulators() const { return int(want_dgamma) + int(want_dbeta); }
  dim3 block() const { return dim3(layout.threads_per_row, layout.rows_per_block); }
  template <class Kernel>
  int resident(Kernel kernel, dim3 threads, size_t shared) const {
    return cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads.x * threads.y, shared,
                                        device.device);
  }
  // What a launch may ask for beyond the dynamic shared memory: the kernels' static scratch.
  bool fits(size_t shared) const { return shared + 1024 <= limits.shared_per_block_optin; }
  // [accumulators, parts, cols]: dgamma's partial rows, then dbeta's.
  void allocate_parts(int64_t parts) {
    num_parts = parts;
    if (accumulators() == 0) return;
    using A = Acc<T>;
    A* base = static_cast<A*>(scratch(sizeof(A) * size_t(accumulators()) * size_t(parts) * size_t(cols)));
    p.dgamma_parts = want_dgamma ? base : nullptr;
    p.dbeta_parts = want_dbeta ? base + (want_dgamma ? parts * cols : 0) : nullptr;
  }
  template <class Kernel>
  void operator()(Kernel kernel, size_t shared, dim3 threads) {
    const int64_t row_blocks = (rows + threads.y - 1) / threads.y;
    const int64_t blocks = std::min<int64_t>(row_blocks, int64_t(resident(kernel, threads, shared)) * limits.sms);
    allocate_parts(blocks);
    cuda::launch_dependent(device, kernel, dim3(static_cast<unsigned>(blocks)), threads, shared, stream, p);
  }
};

// Launches backward_fused for rows of ITEMS vectors per thread, or returns false where it does not
// apply (rows whose gamma copy leaves no room in shared memory next to the accumulators, near the
// limit: backward_in_registers takes those). For 16-bit T = W, units of their own instantiate it (see
// the `extern template` declarations below).
template <typename T, typename W, bool RMS, int ITEMS>
bool launch_fused(PersistentLaunch<T, W>& launch) {
  const auto& limits = launch.limits;
  const int accumulators = launch.accumulators();
  const dim3 block = launch.block();
  constexpr bool kPrefetch = fused_can_prefetch<T, W, ITEMS>();
  const auto plain = backward_fused<T, W, ITEMS, RMS, false>;
  const auto prefetching = backward_fused<T, W, ITEMS, RMS, kPrefetch>;
  // The gamma copy, then the accumulators, in chunks of whole threads (fused_region_chunks).
  const size_t region = sizeof(float4) * fused_region_chunks<T>(ITEMS, launch.layout.threads_per_row);
  if constexpr (fused_row_barriers<T, W, ITEMS>()) {
    // Row barriers: as many row slots as kMaxThreads threads hold (at most one per named
    // barrier where a row spans several warps) and shared memory takes.
    const int threads = launch.layout.threads_per_row;
    int slots = kMaxThreads / threads;
    if (threads > limits.warp_size) slots = std::min(slots, kMaxNamedRowBarriers);
    while (slots > 1 && !launch.fits(region * (slots * accumulators + 1))) --slots;
    const size_t shared = region * (slots * accumulators + 1);
    const auto kernel = backward_fused<T, W, ITEMS, RMS, false, true>;
    if (launch.fits(shared) && launch.resident(kernel, dim3(threads, slots), shared) > 0) {
      launch(kernel, shared, dim3(threads, slots));
      return true;
    }
  }
  const size_t with_gamma = region * (launch.layout.rows_per_block * accumulators + 1);
  if (!launch.fits(with_gamma)) return false;
  // Prefetching holds a second row slice in registers. It is used where one block fills an SM
  // anyway (wide rows, whose accumulators and gamma take most of the shared memory): there the
  // registers cost no occupancy, and no other block is around to overlap this one's reductions
  // with loads. Elsewhere it lost (see the top).
  if (kPrefetch && launch.resident(plain, block, with_gamma) == 1) {
    launch(prefetching, with_gamma, block);
  } else {
    launch(plain, with_gamma, block);
  }
  return true;
}

// The fused launches of 16-bit rows (T = W) hold most of their dtype's backward kernels (the row
// barriers and prefetching instances): they compile in units of their own, so that no unit's device
// compile comes near the op's 20 s build on 16 cores (issue 11; benchmarks/build/NOTES.md), each about
// as large as what stays with backward_typed: LayerNorm's in layer_norm_backward_fused_<dtype>.cu (1 and
// 2 vectors a thread) and layer_norm_backward_fused4_<dtype>.cu (4), RMSNorm's (smaller: no beta) all
// in layer_norm_backward_fused_<dtype>_rms.cu. The units instantiating backward_typed see them through
// these declarations.
using Bf16Launch = PersistentLaunch<c10::BFloat16, c10::BFloat16>;
using Fp16Launch = PersistentLaunch<c10::Half, c10::Half>;
extern template bool launch_fused<c10::BFloat16, c10::BFloat16, false, 1>(Bf16Launch&);
extern template bool launch_fused<c10::BFloat16, c10::BFloat16, false, 2>(Bf16Launch&);
extern template bool launch_fused<c10::BFloat16, c10::BFloat16, false, 4>(Bf16Launch&);
extern template bool launch_fused<c10::BFloat16, c10::BFloat16, true, 1>(Bf16Launch&);
extern template bool launch_fused<c10::BFloat16, c10::BFloat16, true, 2>(Bf16Launch&);
extern template bool launch_fused<c10::BFloat16, c10::BFloat16, true, 4>(Bf16Launch&);
extern template bool launch_fused<c10::Half, c10::Half, false, 1>(Fp16Launch&);
extern template bool launch_fused<c10::Half, c10::Half, false, 2>(Fp16Launch&);
extern template bool launch_fused<c10::Half, c10::Half, false, 4>(Fp16Launch&);
extern template bool launch_fused<c10::Half, c10::Half, true, 1>(Fp16Launch&);
extern template bool launch_fused<c10::Half, c10::Half, true, 2>(Fp16Launch&);
extern template bool launch_fused<c10::Half, c10::Half, true, 4>(Fp16Launch&);

template <typename T, typename W, bool RMS>
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
  const cuda::DeviceLimits& limits = cuda::device_limits(device.device);
  const cudaStream_t stream = cuda::stream(device);
  PersistentLaunch<T, W> launch{device, limits, stream, p, scratch, RowLayout{},
                                a.rows, a.cols, a.grad_weight != nullptr, a.grad_bias != nullptr};
  const bool want_dgamma = launch.want_dgamma;
  const int accumulators = launch.accumulators();

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
      launch.layout = *layout;
      const dim3 block = launch.block();
      dispatch_items(layout->items, [&](auto items) {
        constexpr int kItems = std::min(decltype(items)::value, kMaxBackwardElements / V);
        // backward_fused, except where it does not apply; those take backward_in_registers below:
        // - memory_efficient: x_or_y holds y, and xhat = (y - beta) / gamma needs beta and a
        //   division per element, which backward_fused (x, and its FFMA forms) does not carry;
        // - rows whose gamma copy leaves no room in shared memory next to the accumulators (near
        //   the limit), where backward_in_registers reads gamma from global memory instead.
        if (!a.memory_efficient && launch_fused<T, W, RMS, kItems>(launch)) return;
        dispatch_bool(a.memory_efficient, [&](auto memory_efficient) {
          constexpr bool kMemoryEfficient = decltype(memory_efficient)::value;
          // Only rows wider than kBackwardItems vectors per thread reach one block per SM, so
          // narrower instances are not compiled with prefetch (they would never be chosen).
          constexpr bool kCanPrefetch = !kMemoryEfficient && kItems > kBackwardItems &&
                                        kItems * V * (sizeof(T) + sizeof(W)) <= kMaxPrefetchSliceBytes;
          if (kCanPrefetch && one_block_per_sm) {
            launch(backward_in_registers<T, W, kItems, RMS, kMemoryEfficient, kCanPrefetch>, smem, block);
          } else {
            launch(backward_in_registers<T, W, kItems, RMS, kMemoryEfficient, false>, smem, block);
          }
        });
      });
    }
  } else {
    const RowLayout shape = streaming_layout(a.cols, limits.warp_size);
    const int64_t blocks = (a.rows + shape.rows_per_block - 1) / shape.rows_per_block;
    backward_streaming<T, W, RMS><<<blocks, dim3(shape.threads_per_row, shape.rows_per_block), 0, stream>>>(p);
    if (accumulators > 0) {
      const int64_t column_blocks = (a.cols + kFoldColumns - 1) / kFoldColumns;
      // Enough row chunks to give every SM a few blocks, each chunk at least kFoldRows rows.
      const int64_t wanted = std::max<int64_t>(1, 4 * limits.sms / column_blocks);
      const int64_t chunks = std::min<int64_t>(wanted, (a.rows + kFoldRows - 1) / kFoldRows);
      const int64_t rows_per_chunk = (a.rows + chunks - 1) / chunks;
      launch.allocate_parts(chunks);
      parameter_grads_by_columns<T, W>
          <<<dim3(column_blocks, chunks), dim3(kFoldColumns, kFoldRows), 0, stream>>>(p, rows_per_chunk);
    }
  }

  if (accumulators > 0) {
    W* first = static_cast<W*>(want_dgamma ? a.grad_weight : a.grad_bias);
    W* second = accumulators == 2 ? static_cast<W*>(a.grad_bias) : nullptr;
    const dim3 grid((a.cols + kFoldColumns - 1) / kFoldColumns, accumulators);
    const A* parts = want_dgamma ? p.dgamma_parts : p.dbeta_parts;
    cuda::launch_dependent(device, sum_partial_rows<A, W>, grid, dim3(kFoldColumns, kFoldRows), 0, stream,
                           parts, launch.num_parts, static_cast<int>(a.cols), first, second);
  }
  cuda::check_launch(a.rms ? "rms_norm_bwd" : "layer_norm_bwd");
}

}  // namespace apex::layer_norm
