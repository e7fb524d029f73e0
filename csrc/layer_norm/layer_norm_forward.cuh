#pragma once
// LayerNorm / RMSNorm forward on CUDA: the kernels and forward_typed<T, W>, which
// layer_norm_forward_<dtypes>.cu instantiate, one dtype pair each (so that ninja compiles them in
// parallel), and layer_norm_forward.cu dispatches to.
//
// One pass over memory: each row is read once into registers (16-byte loads), reduced, normalized
// and written. Rows that are not 16-byte aligned, or too wide for registers, take a scalar kernel
// that reads the row three times (the re-reads are mostly cache hits).
//
// Register-resident rows take forward_vectorized wherever a row spans whole warps, and
// forward_in_registers (the kernel before it) where a row is narrower than a warp.
// With 16-bit data this forward is bound by instruction issue as much as by memory: at copy speed
// an H200 moves the 4 bytes of a bf16 element (x in, y out) in ~1e-12 s, time for ~32
// thread-instructions at perfect issue, and forward_in_registers spends 28 per element (LayerNorm;
// RMSNorm 17). forward_vectorized keeps that kernel's launch structure and cuts the instructions:
//   - 16-bit x stays in the 32-bit words it was loaded as, widened again at each of its three passes:
//     ~2 more instructions per element than keeping floats, for half the row's registers (below);
//   - 1/cols is a multiply, 1/sqrt an rsqrtf, and the normalization one FFMA for 16-bit data;
//   - a thread's vectors sit at fixed offsets from one pointer per row (immediate offsets in the
//     loads and stores, no 64-bit index arithmetic per vector);
//   - outputs are rounded two per conversion instruction, 16-bit gamma/beta widened from the
//     32-bit words they are loaded as;
//   - the reductions are unrolled shuffle trees with one barrier per cross-warp exchange.
// The launch structure matters as much as the count: a grid of many short-lived blocks, one row per
// row-slot, lets an SM overlap one block's loads with another's reductions. A persistent grid with the
// same arithmetic and 16-bit gamma/beta converted once per block into shared memory (forward_rows,
// session 28, benchmarks/normalization/NOTES.md) serialized load -> reduce -> store within each
// resident block: latency-bound on an H200 (SM throughput 31%, DRAM 69% at 16384x4096 bf16), 78-83%
// of copy for bf16 LayerNorm and below forward_in_registers for float data; this kernel reaches
// 91-96% (bf16, session 30) with no loss for float.

#include "apex/packed_pairs.cuh"
#include "layer_norm_cuda.cuh"

namespace apex::layer_norm {
namespace {

template <typename T, typename W>
struct ForwardParams {
  const T* x;
  const W* gamma;  // nullable
  const W* beta;   // nullable
  W* y;
  Acc<T>* mean;  // nullable (RMSNorm)
  Acc<T>* invvar;
  int64_t rows;
  int cols;
  Acc<T> eps;
  Acc<T> inv_cols;  // 1 / cols: statistics by a multiply (forward_vectorized)
};

// mean (0 for RMSNorm) and invvar of a row from its per-thread sums; `centered_sq` maps the
// mean to the thread's sum of squared deviations. Writes both statistics for live rows.
template <bool RMS, typename T, typename W, typename SumFn, typename SqFn>
__device__ __forceinline__ void row_statistics(const ForwardParams<T, W>& p, int64_t row, bool live, SumFn local_sum,
                                               SqFn centered_sq, Acc<T>& mean, Acc<T>& invvar) {
  using A = Acc<T>;
  __shared__ A scratch[kMaxWarps];
  mean = A(0);
  if constexpr (!RMS) {
    A s[1] = {local_sum()};
    row_sum(s, scratch);
    mean = s[0] / p.cols;
  }
  A sq[1] = {centered_sq(mean)};
  row_sum(sq, scratch);
  invvar = A(1) / sqrt(sq[0] / p.cols + p.eps);
  if (live && threadIdx.x == 0) {
    if constexpr (!RMS) p.mean[row] = mean;
    p.invvar[row] = invvar;
  }
}

template <typename T, typename W, int ITEMS, bool RMS>
__global__ void __launch_bounds__(kMaxRegisterRowThreads) forward_in_registers(ForwardParams<T, W> p) {
  using A = Acc<T>;
  constexpr int V = vector_width<T>();
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < p.rows;
  const int vecs = p.cols / V;
  const auto in_row = [&](int k) { return live && int(threadIdx.x) + k * int(blockDim.x) < vecs; };
  // Element offset of the thread's k-th vector within a row.
  const auto column = [&](int k) { return (int(threadIdx.x) + k * int(blockDim.x)) * V; };

  AlignedVector<T, V> x[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    if (in_row(k)) x[k] = load_vector<V>(p.x, row * p.cols + column(k));
  }

  const auto local_sum = [&] {
    A s = A(0);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (!in_row(k)) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) s += static_cast<A>(x[k].value[j]);
    }
    return s;
  };
  const auto centered_sq = [&](A mean) {
    A s = A(0);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (!in_row(k)) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A d = static_cast<A>(x[k].value[j]) - mean;
        s += d * d;
      }
    }
    return s;
  };
  A mean, invvar;
  row_statistics<RMS>(p, row, live, local_sum, centered_sq, mean, invvar);

#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    if (!in_row(k)) continue;
    AlignedVector<W, V> g, b, out;
    if (p.gamma) g = load_vector<V>(p.gamma, column(k));
    if (p.beta) b = load_vector<V>(p.beta, column(k));
#pragma unroll
    for (int j = 0; j < V; ++j) {
      A v = (static_cast<A>(x[k].value[j]) - mean) * invvar;
      if (p.gamma) v *= static_cast<A>(g.value[j]);
      if (p.beta) v += static_cast<A>(b.value[j]);
      out.value[j] = static_cast<W>(v);
    }
    store_vector<V>(p.y, row * p.cols + column(k), out);
  }
}

template <typename T, typename W, bool RMS>
__global__ void forward_streaming(ForwardParams<T, W> p) {
  using A = Acc<T>;
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < p.rows;
  const int end = live ? p.cols : 0;
  const T* x = p.x + row * p.cols;

  const auto local_sum = [&] {
    A s = A(0);
    for (int c = threadIdx.x; c < end; c += blockDim.x) s += static_cast<A>(x[c]);
    return s;
  };
  const auto centered_sq = [&](A mean) {
    A s = A(0);
    for (int c = threadIdx.x; c < end; c += blockDim.x) {
      const A d = static_cast<A>(x[c]) - mean;
      s += d * d;
    }
    return s;
  };
  A mean, invvar;
  row_statistics<RMS>(p, row, live, local_sum, centered_sq, mean, invvar);

  W* y = p.y + row * p.cols;
  for (int c = threadIdx.x; c < end; c += blockDim.x) {
    A v = (static_cast<A>(x[c]) - mean) * invvar;
    if (p.gamma) v *= static_cast<A>(p.gamma[c]);
    if (p.beta) v += static_cast<A>(p.beta[c]);
    y[c] = static_cast<W>(v);
  }
}

// ---------------------------------------------------------------------------------------------
// Rows of whole warps: helpers of forward_vectorized.

// Lanes of a warp (forward_vectorized is launched only where the device's warp has this many).
constexpr int kWarp = 32;
// Warps of one row at most: the row's partial sums fit in half a warp, which row_total relies on.
constexpr int kMaxRowWarps = kMaxRegisterRowThreads / kWarp;
static_assert(kMaxRowWarps <= kWarp / 2, "row_total folds the per-warp sums in half a warp");

// What one SM holds (sm_80 to sm_90), and the step in which ptxas allocates a thread's registers.
constexpr int kSmRegisters = 65536;
constexpr int kSmThreads = 2048;
constexpr int kRegisterStep = 8;
constexpr int kMaxForwardRegisters = kSmRegisters / kMaxRegisterRowThreads;  // a block of 512 threads must fit an SM

// A kernel's register cap (CUDA 12.4+). ROCm has no such attribute: its compiler chooses.
#if defined(USE_ROCM)
#define APEX_LN_FWD_MAX_REGISTERS(n)
#else
#define APEX_LN_FWD_MAX_REGISTERS(n) __maxnreg__(n)
#endif

// N consecutive elements of E (float, c10::Half or c10::BFloat16) kept as 32-bit words, as they
// are loaded: a 16-bit element pair shares a register until get() widens it. Moved by 16-byte
// accesses: N * sizeof(E) is a multiple of 16 and the address a multiple of N * sizeof(E).
template <typename E, int N>
struct Words {
  static constexpr int kCount = N * int(sizeof(E)) / 4;
  static_assert(kCount % 4 == 0 && (sizeof(E) == 2 || sizeof(E) == 4), "whole 16-byte vectors of 16/32-bit elements");
  uint32_t w[kCount];

  __device__ __forceinline__ void load(const E* p) {
#pragma unroll
    for (int v = 0; v < kCount / 4; ++v) {
      const auto q = load_vector<4>(reinterpret_cast<const uint32_t*>(p), 4 * v);
#pragma unroll
      for (int i = 0; i < 4; ++i) w[4 * v + i] = q.value[i];
    }
  }

  __device__ __forceinline__ void store(E* p) const {
#pragma unroll
    for (int v = 0; v < kCount / 4; ++v) {
      AlignedVector<uint32_t, 4> q;
#pragma unroll
      for (int i = 0; i < 4; ++i) q.value[i] = w[4 * v + i];
      store_vector<4>(reinterpret_cast<uint32_t*>(p), 4 * v, q);
    }
  }

  // Element i (a compile-time constant after unrolling) in float: one instruction for 16-bit E
  // (bf16: a shift or a mask of the word; fp16: one conversion).
  __device__ __forceinline__ float get(int i) const {
    if constexpr (sizeof(E) == 4) {
      return __uint_as_float(w[i]);
    } else {
      const uint32_t word = w[i / 2];
      const bool high = i % 2 == 1;
      if constexpr (std::is_same_v<E, c10::BFloat16>) return __uint_as_float(high ? word & 0xffff0000u : word << 16);
      const auto bits = static_cast<uint16_t>(high ? word >> 16 : word & 0xffffu);
      return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
    }
  }

  // Elements i and i + 1 (i even) from floats, rounded to nearest even as static_cast<E> rounds:
  // for 16-bit E one conversion instruction for the pair (pack_pair).
  __device__ __forceinline__ void set_pair(int i, float lo, float hi) {
    if constexpr (sizeof(E) == 4) {
      w[i] = __float_as_uint(lo);
      w[i + 1] = __float_as_uint(hi);
    } else {
      w[i / 2] = pack_pair<E>(lo, hi);
    }
  }
};

// Calls f(k) for each k < n of the thread's ITEMS vectors. The common case, all ITEMS, runs
// unrolled without a test per vector; a thread at the end of a row tests each.
template <int ITEMS, typename F>
__device__ __forceinline__ void for_items(int n, F&& f) {
  if (n == ITEMS) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) f(k);
  } else {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (k < n) f(k);
    }
  }
}

// The sum of `value` over the blockDim.x (whole warps) threads of one row; every one of them gets
// it. Must be reached by every thread of the block. The per-warp sums of a row go through one of
// two shared buffers, which callers alternate (`buffer`), so that one barrier per call suffices:
// a buffer is written again only after the barrier of a call on the other one, which every thread
// reaches after it read this one. (The buffers are indexed here rather than passed as pointers:
// those would be generic addresses, converted to shared ones at every access.)
__device__ __forceinline__ float row_total(float value, int buffer) {
  __shared__ float partials[2][kMaxRowWarps];
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value += shuffle_xor(value, offset);
  if (blockDim.x == kWarp) return value;
  const int warps = blockDim.x / kWarp, lane = threadIdx.x % kWarp;
  const int row = threadIdx.y * warps;
  if (lane == 0) partials[buffer][row + threadIdx.x / kWarp] = value;
  __syncthreads();
  // Both half-warps read the (at most kWarp / 2) sums, so the last kWarp / 2 offsets give every
  // lane the total.
  const int slot = lane % (kWarp / 2);
  value = slot < warps ? partials[buffer][row + slot] : 0.f;
#pragma unroll
  for (int offset = kWarp / 4; offset > 0; offset /= 2) value += shuffle_xor(value, offset);
  return value;
}

// ---------------------------------------------------------------------------------------------
// forward_vectorized: the forward wherever a row spans whole warps.

// Registers a forward_vectorized thread needs beside its row slice (as loaded): row pointers, the
// statistics, one vector's gamma/beta words and results. With 24, 4 vectors per thread (16 words of
// row, float or 16-bit) get 40 registers, as float data had in forward_in_registers (6 blocks of 256
// threads per SM; 48 would leave 5).
constexpr int kVectorizedOverhead = 24;

// Register cap of a forward_vectorized instance: the most registers per thread that keep as many
// 256-thread blocks resident as slice + kVectorizedOverhead would (64 at 8 bf16 vectors per
// thread: 4 blocks per SM either way). Without a cap ptxas hoists the gamma/beta loads of later
// vectors and holds them (~96 registers at 4 bf16 vectors when rows were held as floats), which cuts
// the resident blocks. The slice is counted as loaded: two elements a register for 16-bit T.
template <typename T, int ITEMS>
constexpr int vectorized_registers() {
  constexpr int kSlice = ITEMS * vector_width<T>() * int(sizeof(T)) / 4;
  constexpr int kNeeded = (kSlice + kVectorizedOverhead + kRegisterStep - 1) / kRegisterStep * kRegisterStep;
  constexpr int kByRegisters = kSmRegisters / (kNeeded * kBlockThreads);
  constexpr int kBlocks = kByRegisters < kSmThreads / kBlockThreads ? kByRegisters : kSmThreads / kBlockThreads;
  static_assert(kBlocks >= 1, "a 256-thread block must fit an SM");
  constexpr int kCap = kSmRegisters / (kBlocks * kBlockThreads) / kRegisterStep * kRegisterStep;
  return kCap < kMaxForwardRegisters ? kCap : kMaxForwardRegisters;
}

// y = (x - mean) * invvar * gamma + beta, one row per row-slot (threadIdx.y) of a block, as many
// blocks as rows need: a block's rows are independent, and an SM overlaps resident blocks' loads,
// reductions and stores. A row is split into chunks of kWarp vectors; warp w of the row owns chunks
// [w * ITEMS, (w + 1) * ITEMS), lane l vector l of each. A thread's columns are then fixed offsets
// from one pointer: x, y, gamma and beta need one address per row and immediate offsets.
// gamma/beta are loaded from global memory for every row (L1/L2 hits after the first rows).
// 16-bit x stays in the words it was loaded as and is widened again at each of the three passes (one
// more instruction per element and pass after the first, ~14 instead of ~12 per bf16 element), for
// half the slice's registers: 40 instead of 56-60 at 4 vectors a thread, 48 warps an SM instead of 32,
// so more rows' loads in flight per SM. On an H200 (session 30, bf16, against widening x once and
// keeping the floats) that gained 0.5-3.5% at most shapes and lost nowhere beyond noise: LayerNorm
// 32768x1024 3793 -> 3824 GB/s fwd, 3639 -> 3691 fwd+bwd; 4096x16384 3836 -> 3975 fwd
// (benchmarks/normalization/NOTES.md).
template <typename T, typename W, int ITEMS, bool RMS>
__global__ void APEX_LN_FWD_MAX_REGISTERS((vectorized_registers<T, ITEMS>()))
    forward_vectorized(ForwardParams<T, W> p) {
  static_assert(std::is_same_v<Acc<T>, float>, "float statistics");
  cuda::start_dependent_kernel();
  constexpr bool kPacked = sizeof(T) == 2;  // x kept as 16-bit words, not as floats
  constexpr int V = vector_width<T>();
  constexpr int kChunk = kWarp * V;  // elements between a thread's consecutive vectors
  // For 16-bit data the normalization is one FFMA, x * invvar + (-mean * invvar). Rounding
  // -mean * invvar costs an error of |mean| * invvar * 2^-24, negligible beside the 2^-9 relative
  // rounding of a 16-bit x itself; float data keeps (x - mean) * invvar, exact where x ~ mean.
  constexpr bool kFoldMean = sizeof(T) == 2;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int first = warp * ITEMS * kChunk + lane * V;
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < p.rows;
  // The thread's vectors in the row: first + k * kChunk < cols for k < n.
  const int n = live && first < p.cols ? min(ITEMS, (p.cols - first + kChunk - 1) / kChunk) : 0;
  const int64_t offset = row * p.cols + first;  // the thread's first element, in x and y alike
  const T* x = p.x + offset;

  // x as loaded (float data: v; 16-bit: packed), and its sum (LayerNorm) or sum of squares (RMSNorm).
  float v[ITEMS][V];
  Words<T, V> packed[ITEMS] = {};  // 16-bit only; zeros past the row end (never used, but defined)
  const auto value = [&](int k, int j) {
    if constexpr (kPacked) return packed[k].get(j);
    return v[k][j];
  };
  // 16-bit: hides the words from the optimizer, so that the next pass widens them again instead of
  // keeping this pass's floats live across the row reduction (no instruction).
  const auto unpack_again_after_this = [&] {
    if constexpr (kPacked) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
        for (int i = 0; i < Words<T, V>::kCount; ++i) asm volatile("" : "+r"(packed[k].w[i]));
      }
    }
  };
  float sum = 0.f, squares = 0.f;
  for_items<ITEMS>(n, [&](int k) {
    Words<T, V> words;
    words.load(x + k * kChunk);
    if constexpr (kPacked) packed[k] = words;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float e = words.get(j);
      if constexpr (!kPacked) v[k][j] = e;
      if constexpr (RMS) {
        squares = fmaf(e, e, squares);
      } else {
        sum += e;
      }
    }
  });
  unpack_again_after_this();
  float mean = 0.f;
  if constexpr (!RMS) {
    mean = row_total(sum, 0) * p.inv_cols;
    for_items<ITEMS>(n, [&](int k) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float d = value(k, j) - mean;
        squares = fmaf(d, d, squares);
      }
    });
    unpack_again_after_this();
  }
  // One reduction per buffer: the block's rows end with the kernel, so nothing reuses them.
  const float invvar = rsqrtf(row_total(squares, 1) * p.inv_cols + p.eps);
  if (live && threadIdx.x == 0) {
    if constexpr (!RMS) p.mean[row] = mean;
    p.invvar[row] = invvar;
  }

  const float shift = -mean * invvar;
  const auto normalized = [&](float value) {
    if constexpr (RMS) return value * invvar;
    if constexpr (kFoldMean) return fmaf(value, invvar, shift);
    return (value - mean) * invvar;
  };
  W* y = p.y + offset;
  // One copy of the output loop for each of gamma / beta present or not. It goes 16 bytes of W at
  // a time: a vector of V elements is two such pieces for float parameters with 16-bit data, and
  // working on one at a time keeps that case within the register cap.
  constexpr int kPiece = kVectorBytes / int(sizeof(W));
  const auto write = [&](auto has_gamma, auto has_beta) {
    for_items<ITEMS>(n, [&](int k) {
#pragma unroll
      for (int s = 0; s < V; s += kPiece) {
        const int column = first + k * kChunk + s;
        Words<W, kPiece> g, b, out;
        if constexpr (has_gamma) g.load(p.gamma + column);
        if constexpr (has_beta) b.load(p.beta + column);
        float r[kPiece];
#pragma unroll
        for (int j = 0; j < kPiece; ++j) {
          r[j] = normalized(value(k, s + j));
          if constexpr (has_gamma && has_beta) {
            r[j] = fmaf(r[j], g.get(j), b.get(j));
          } else if constexpr (has_gamma) {
            r[j] *= g.get(j);
          } else if constexpr (has_beta) {
            r[j] += b.get(j);
          }
        }
#pragma unroll
        for (int j = 0; j < kPiece; j += 2) out.set_pair(j, r[j], r[j + 1]);
        out.store(y + k * kChunk + s);
      }
    });
  };
  if (p.gamma && p.beta) {
    write(std::true_type{}, std::true_type{});
  } else if (p.gamma) {
    write(std::true_type{}, std::false_type{});
  } else if (p.beta) {
    write(std::false_type{}, std::true_type{});
  } else {
    write(std::false_type{}, std::false_type{});
  }
}

}  // namespace

template <typename T, typename W>
void forward_typed(const Cuda& device, const ForwardArgs& a) {
  using A = Acc<T>;
  const ForwardParams<T, W> p{static_cast<const T*>(a.input),
                              static_cast<const W*>(a.weight),
                              static_cast<const W*>(a.bias),
                              static_cast<W*>(a.output),
                              static_cast<A*>(a.mean),
                              static_cast<A*>(a.invvar),
                              a.rows,
                              static_cast<int>(a.cols),
                              static_cast<A>(a.eps),
                              A(1) / static_cast<A>(a.cols)};
  constexpr int V = vector_width<T>();
  constexpr size_t kOutputAlignment = alignof(AlignedVector<W, V>);
  const bool vectorizable = !std::is_same_v<T, double> && a.cols % V == 0 && is_aligned(p.x) &&
                            is_aligned(p.y, kOutputAlignment) && is_aligned(p.gamma, kOutputAlignment) &&
                            is_aligned(p.beta, kOutputAlignment);
  const cuda::DeviceLimits& limits = cuda::device_limits(device.device);
  const int warp = limits.warp_size;
  const std::optional<RowLayout> layout =
      vectorizable ? register_layout(a.cols / V, warp, kMaxRegisterRowThreads) : std::nullopt;
  const RowLayout shape = layout.value_or(streaming_layout(a.cols, warp));
  const dim3 block(shape.threads_per_row, shape.rows_per_block);
  const int64_t blocks = (a.rows + shape.rows_per_block - 1) / shape.rows_per_block;
  const cudaStream_t stream = cuda::stream(device);
  // forward_vectorized needs rows of whole 32-lane warps; narrower rows (bf16 up to 128 columns,
  // float up to 64), and 64-lane wavefronts, take forward_in_registers.
  const bool whole_warps = warp == kWarp && shape.threads_per_row % kWarp == 0;
  dispatch_bool(a.rms, [&](auto rms) {
    constexpr bool kRms = decltype(rms)::value;
    if (!layout) {
      forward_streaming<T, W, kRms><<<blocks, block, 0, stream>>>(p);
      return;
    }
    if constexpr (!std::is_same_v<T, double>) {
      dispatch_items(shape.items, [&](auto items) {
        constexpr int kItems = decltype(items)::value;
        if (whole_warps) {
          cuda::launch_dependent(device, forward_vectorized<T, W, kItems, kRms>, dim3(static_cast<unsigned>(blocks)),
                                 block, 0, stream, p);
        } else {
          forward_in_registers<T, W, kItems, kRms><<<blocks, block, 0, stream>>>(p);
        }
      });
    }
  });
  cuda::check_launch(a.rms ? "rms_norm_fwd" : "layer_norm_fwd");
}

}  // namespace apex::layer_norm
