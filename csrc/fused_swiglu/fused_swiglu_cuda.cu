// fused_bias_swiglu: CUDA kernels. Blocks tile [rows, half] column-major: threadIdx.x walks 16-byte
// packs across a row (a warp reads 512 contiguous bytes of each half), threadIdx.y and blockIdx.y
// walk down the rows. Each thread keeps its column's bias in registers, and in the backward its
// column's bias-gradient partial sums, which blocks fold into a per-row-chunk workspace row; a
// second small kernel sums the chunks. So the data is read and written exactly once each way.
// 16-bit data on the vector path take one-shot kernels instead (a thread, one pack of one row; see
// flat_forward_kernel), except the backward with a bias gradient, which needs the chunk loop's sums.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "apex/cuda.cuh"
#include "apex/dependent_launch.cuh"
#include "apex/fast_exp2.cuh"
#include "fused_swiglu.h"
#include "swiglu_math.h"

namespace apex::fused_swiglu {
namespace {

constexpr int kColumns = 32;                   // packs across a row per block
constexpr int kRows = 8;                       // rows a block works on at once
constexpr int kThreads = kColumns * kRows;     // 256
constexpr int kBlocksPerSm = 8;                // blocks the grid is sized for: 2048 threads per SM
// Blocks the register budget must keep resident: 768 threads per SM forward (85 registers), 512
// backward (128: it also keeps its columns' bias-gradient sums). Unbounded, the bf16 backward took
// 161 registers (one block per SM); at 64 registers both spilled.
constexpr int kMinForwardBlocksPerSm = 3;
constexpr int kMinBackwardBlocksPerSm = 2;
// Rows a thread loads before using any: 2 * kUnroll 16-byte loads in flight per thread forward,
// 3 * kUnroll backward: ~48 KB per SM at the occupancy above, what HBM3 needs to reach copy bandwidth.
constexpr int kUnroll = 2;
// Chunks never shorter than this many rows (so the bias-gradient partials stay small).
constexpr int64_t kMinChunkRows = kRows * kUnroll;
// Columns (elements) the chunk count is planned with; independent of the dtype and of whether the
// vector path runs, so the workspace size is known before the launch picks its path.
constexpr int64_t kPlanTileColumns = kColumns * 8;

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// 16-bit data take the special-function unit's sigmoid (a few ulp of float, far below a 16-bit
// rounding). With expf and an IEEE division the bf16 forward issued ~46 instructions an element:
// more than an H200 SM issues while its memory streams at copy speed (~41 an element forward, ~69
// a gate/up pair backward), so the kernels were issue-bound there (78-85% of copy).
struct FastSigmoid {
  C10_DEVICE float operator()(float a) const { return fast_sigmoid(a); }
};
template <class T>
using SigmoidFor = std::conditional_t<sizeof(T) == 2, FastSigmoid, Sigmoid>;

// Row chunks (gridDim.y): enough blocks for kBlocksPerSm per SM over the column tiles.
int64_t row_chunks(const Cuda& device, int64_t rows, int64_t half) {
  constexpr int64_t kMaxGridY = 65535;
  const int64_t tiles = std::max<int64_t>(1, (half + kPlanTileColumns - 1) / kPlanTileColumns);
  const int64_t wanted = static_cast<int64_t>(cuda::sm_count(device.device)) * kBlocksPerSm / tiles;
  const int64_t most = (rows + kMinChunkRows - 1) / kMinChunkRows;
  return std::max<int64_t>(1, std::min({wanted, most, kMaxGridY}));
}

template <class T, int kVec>
struct Pack {
  AlignedVector<T, kVec> v;
  C10_DEVICE C10_ALWAYS_INLINE void load(const T* base, int64_t offset) { v = load_vector<kVec>(base, offset); }
  C10_DEVICE C10_ALWAYS_INLINE acc_t<T> operator[](int k) const { return static_cast<acc_t<T>>(v.value[k]); }
};

// The bias of this thread's columns (zeros without one), kept in T: half the registers of floats.
template <class T, int kVec>
C10_DEVICE void load_bias(const T* bias, int64_t half, int64_t col, Pack<T, kVec>& gate, Pack<T, kVec>& up) {
  if (bias != nullptr) {
    gate.load(bias, col);
    up.load(bias, half + col);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) gate.v.value[k] = up.v.value[k] = T(0);
  }
}

// The gate and up packs at `col` of the rows first + u * kRows (u < kUnroll) below `last`: all
// loads issued before any is used.
template <class T, int kVec>
struct GateUp {
  Pack<T, kVec> gate[kUnroll], up[kUnroll];
  C10_DEVICE C10_ALWAYS_INLINE void load(const T* x, int64_t half, int64_t col, int64_t first, int64_t last) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = first + u * kRows;
      if (r < last) {
        gate[u].load(x, r * 2 * half + col);
        up[u].load(x, r * 2 * half + half + col);
      }
    }
  }
};

template <class T, int kVec>
__global__ void __launch_bounds__(kThreads, kMinForwardBlocksPerSm)
    forward_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, int64_t rows, int64_t half,
                   int64_t chunk_rows) {
  using Acc = acc_t<T>;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x) * kVec;
  if (col >= half) return;  // no block-wide synchronization below
  Pack<T, kVec> bias_gate, bias_up;
  load_bias<T, kVec>(bias, half, col, bias_gate, bias_up);
  const int64_t last = std::min(rows, (blockIdx.y + 1) * chunk_rows);
  for (int64_t first = blockIdx.y * chunk_rows + threadIdx.y; first < last; first += kRows * kUnroll) {
    GateUp<T, kVec> in;
    in.load(x, half, col, first, last);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = first + u * kRows;
      if (r < last) {
        AlignedVector<T, kVec> out;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          out.value[k] = static_cast<T>(swiglu(in.gate[u][k] + bias_gate[k], in.up[u][k] + bias_up[k], SigmoidFor<T>{}));
        }
        store_vector<kVec>(y, r * half + col, out);
      }
    }
  }
}

// kBiasGrad: also write this block's column sums of grad_x to partials[blockIdx.y, :]. kDependent:
// launched as a programmatic dependent launch (16-bit data on the vector path, as the one-shot
// kernels; fp32 and fp64 keep ordinary launches).
template <class T, int kVec, bool kBiasGrad, bool kDependent = false>
__global__ void __launch_bounds__(kThreads, kMinBackwardBlocksPerSm)
    backward_kernel(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ bias,
                    T* __restrict__ grad_x, acc_t<T>* __restrict__ partials, int64_t rows, int64_t half,
                    int64_t chunk_rows) {
  using Acc = acc_t<T>;
  if constexpr (kDependent) cuda::start_dependent_kernel();
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x) * kVec;
  const bool live = col < half;  // the bias-gradient fold below needs every thread of the block
  Pack<T, kVec> bias_gate, bias_up;
  Acc sum_gate[kVec], sum_up[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) sum_gate[k] = sum_up[k] = Acc(0);
  if (live) load_bias<T, kVec>(bias, half, col, bias_gate, bias_up);
  const int64_t last = live ? std::min(rows, (blockIdx.y + 1) * chunk_rows) : 0;
  for (int64_t first = blockIdx.y * chunk_rows + threadIdx.y; first < last; first += kRows * kUnroll) {
    Pack<T, kVec> g[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (first + u * kRows < last) g[u].load(grad_y, (first + u * kRows) * half + col);
    }
    GateUp<T, kVec> in;
    in.load(x, half, col, first, last);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = first + u * kRows;
      if (r < last) {
        AlignedVector<T, kVec> d_gate, d_up;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const SwigluGrad<Acc> d = swiglu_grad(g[u][k], in.gate[u][k] + bias_gate[k], in.up[u][k] + bias_up[k],
                                                   SigmoidFor<T>{});
          d_gate.value[k] = static_cast<T>(d.gate);
          d_up.value[k] = static_cast<T>(d.up);
          if constexpr (kBiasGrad) {
            sum_gate[k] += d.gate;
            sum_up[k] += d.up;
          }
        }
        store_vector<kVec>(grad_x, r * 2 * half + col, d_gate);
        store_vector<kVec>(grad_x, r * 2 * half + half + col, d_up);
      }
    }
  }
  if constexpr (kBiasGrad) {
    // Fold the kRows threads of each column, then one thread per column writes the block's sums.
    __shared__ Acc fold[kRows][kColumns][2 * kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      fold[threadIdx.y][threadIdx.x][k] = sum_gate[k];
      fold[threadIdx.y][threadIdx.x][kVec + k] = sum_up[k];
    }
    __syncthreads();
    if (threadIdx.y == 0 && live) {
      Acc* row = partials + static_cast<int64_t>(blockIdx.y) * 2 * half;
#pragma unroll
      for (int k = 0; k < 2 * kVec; ++k) {
        Acc total = Acc(0);
#pragma unroll
        for (int r = 0; r < kRows; ++r) total += fold[r][threadIdx.x][k];
        row[(k < kVec ? col : half + col) + k % kVec] = total;
      }
    }
  }
}

// grad_bias[j] = sum over chunks of partials[chunk, j]. kDependent: as backward_kernel's.
template <class T, bool kDependent = false>
__global__ void fold_bias_grad_kernel(const acc_t<T>* __restrict__ partials, T* __restrict__ grad_bias,
                                      int64_t chunks, int64_t width) {
  if constexpr (kDependent) cuda::start_dependent_kernel();  // after the partials of backward_kernel
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < width;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc_t<T> total = acc_t<T>(0);
    for (int64_t c = 0; c < chunks; ++c) total += partials[c * width + j];
    grad_bias[j] = static_cast<T>(total);
  }
}

// Whether every access of the kVec-wide path is a whole aligned 16-byte vector.
template <class T>
bool vector_path(int64_t half, std::initializer_list<const void*> pointers) {
  if (half % vector_width<T>() != 0) return false;
  for (const void* p : pointers) {
    if (p != nullptr && !is_aligned(p)) return false;
  }
  return true;
}

template <int kVec>
dim3 grid_for(int64_t half, int64_t chunks) {
  const int64_t packs = (half + kVec - 1) / kVec;
  return dim3(static_cast<unsigned>((packs + kColumns - 1) / kColumns), static_cast<unsigned>(chunks));
}

// ---- One-shot kernels: 16-bit data on the vector path, forward and the backward without a bias
// gradient. A thread does one 16-byte pack of one row and its block exits (torch.compile's Triton
// forward is built so: 101-104% of copy). They hold 32 registers: 8 blocks, 2048 threads an SM,
// with 32 (forward) / 48 (backward) bytes of loads in flight a thread, 64 / 96 KB an SM, where the
// chunk kernels keep 768 / 512 threads and ~48 KB; and the block scheduler refills an SM as blocks
// finish, where a chunk kernel's warp has no loads in flight while it computes and stores. H200,
// bf16, session 30: 102.5-104.0% of copy forward, 99.6-103.0% forward+backward, against the chunk
// kernels' 95.0-96.2% / 96.1-97.7. On the vector path every kernel of a 16-bit op is a
// programmatic dependent launch (forward -> backward -> bias-gradient fold -> next forward: each
// one's blocks take SMs while the previous one's last blocks finish): +0.2-1.2% over ordinary
// launches. Evict-first hints (L1::no_allocate loads, st.global.cs stores) lost 3-5% forward.
//
// Two rows a thread spilled even at 64 registers (bf16). The backward with a bias keeps 40 registers
// (6 blocks an SM): at 32 it spilled 36 bytes.
constexpr int kFlatBlocksPerSm = 8;
constexpr int kFlatBiasBackwardBlocksPerSm = 6;

// The float values of a 16-bit pack plus (kBias) the bias pack's.
template <bool kBias, class T>
C10_DEVICE C10_ALWAYS_INLINE float with_bias(const AlignedVector<T, 8>& v, const AlignedVector<T, 8>& b, int k) {
  if constexpr (kBias) return static_cast<float>(v.value[k]) + static_cast<float>(b.value[k]);
  return static_cast<float>(v.value[k]);
}

// The one-shot kernels' walk: the thread's column pack, at row threadIdx.y of the row group at
// blockIdx.y, then every gridDim.y-th group (one pass unless rows > 65535 * kRows); f(row, column,
// bias gate pack, bias up pack) for each. Launched dependent: each thread waits for the previous kernel
// before its first access. The column's bias packs (kBias) are read by every row group of the column
// tile, so from cache.
template <class T, bool kBias, class F>
C10_DEVICE C10_ALWAYS_INLINE void for_each_flat_row(const T* bias, int64_t rows, int64_t half, F&& f) {
  static_assert(sizeof(T) == 2, "the one-shot kernels take 16-bit data");
  cuda::start_dependent_kernel();
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x) * 8;
  if (col >= half) return;
  AlignedVector<T, 8> bias_gate, bias_up;
  if constexpr (kBias) {
    bias_gate = load_vector<8>(bias, col);
    bias_up = load_vector<8>(bias, half + col);
  }
  const int64_t step = static_cast<int64_t>(gridDim.y) * kRows;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRows + threadIdx.y; r < rows; r += step) {
    f(r, col, bias_gate, bias_up);
  }
}

template <class T, bool kBias>
__global__ void __launch_bounds__(kThreads, kFlatBlocksPerSm)
    flat_forward_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, int64_t rows,
                        int64_t half) {
  constexpr int kVec = 8;
  for_each_flat_row<T, kBias>(bias, rows, half, [&](int64_t r, int64_t col, const auto& bias_gate, const auto& bias_up) {
    const AlignedVector<T, kVec> gate = load_vector<kVec>(x + r * 2 * half + col, 0);
    const AlignedVector<T, kVec> up = load_vector<kVec>(x + r * 2 * half + half + col, 0);
    AlignedVector<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      out.value[k] = static_cast<T>(
          swiglu(with_bias<kBias>(gate, bias_gate, k), with_bias<kBias>(up, bias_up, k), FastSigmoid{}));
    }
    store_vector_global(y + r * half + col, out);
  });
}

// grad_x only (no bias gradient).
template <class T, bool kBias>
__global__ void __launch_bounds__(kThreads, kBias ? kFlatBiasBackwardBlocksPerSm : kFlatBlocksPerSm)
    flat_backward_kernel(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ bias,
                         T* __restrict__ grad_x, int64_t rows, int64_t half) {
  constexpr int kVec = 8;
  for_each_flat_row<T, kBias>(bias, rows, half, [&](int64_t r, int64_t col, const auto& bias_gate, const auto& bias_up) {
    const AlignedVector<T, kVec> g = load_vector<kVec>(grad_y + r * half + col, 0);
    const AlignedVector<T, kVec> gate = load_vector<kVec>(x + r * 2 * half + col, 0);
    const AlignedVector<T, kVec> up = load_vector<kVec>(x + r * 2 * half + half + col, 0);
    AlignedVector<T, kVec> d_gate, d_up;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const SwigluGrad<float> d = swiglu_grad(static_cast<float>(g.value[k]), with_bias<kBias>(gate, bias_gate, k),
                                              with_bias<kBias>(up, bias_up, k), FastSigmoid{});
      d_gate.value[k] = static_cast<T>(d.gate);
      d_up.value[k] = static_cast<T>(d.up);
    }
    store_vector_global(grad_x + r * 2 * half + col, d_gate);
    store_vector_global(grad_x + r * 2 * half + half + col, d_up);
  });
}

dim3 flat_grid(int64_t rows, int64_t half) {
  constexpr int64_t kMaxGridY = 65535;
  const int64_t groups = (rows + kRows - 1) / kRows;
  return dim3(static_cast<unsigned>((half / 8 + kColumns - 1) / kColumns),
              static_cast<unsigned>(std::min(groups, kMaxGridY)));
}

template <class T>
void flat_forward(const Cuda& device, const T* x, const T* bias, T* y, int64_t rows, int64_t half) {
  const dim3 grid = flat_grid(rows, half), block(kColumns, kRows);
  const cudaStream_t stream = cuda::stream(device);
  if (bias != nullptr) {
    cuda::launch_dependent(device, flat_forward_kernel<T, true>, grid, block, 0, stream, x, bias, y, rows, half);
  } else {
    cuda::launch_dependent(device, flat_forward_kernel<T, false>, grid, block, 0, stream, x, bias, y, rows, half);
  }
}

template <class T>
void flat_backward(const Cuda& device, const T* g, const T* x, const T* bias, T* dx, int64_t rows, int64_t half) {
  const dim3 grid = flat_grid(rows, half), block(kColumns, kRows);
  const cudaStream_t stream = cuda::stream(device);
  if (bias != nullptr) {
    cuda::launch_dependent(device, flat_backward_kernel<T, true>, grid, block, 0, stream, g, x, bias, dx, rows, half);
  } else {
    cuda::launch_dependent(device, flat_backward_kernel<T, false>, grid, block, 0, stream, g, x, bias, dx, rows, half);
  }
}

}  // namespace

void forward(const Cuda& device, const ForwardArgs& args) {
  if (args.rows == 0 || args.half == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* x = static_cast<const T*>(args.x);
    const auto* bias = static_cast<const T*>(args.bias);
    auto* y = static_cast<T*>(args.y);
    const int64_t chunks = row_chunks(device, args.rows, args.half);
    const int64_t chunk_rows = (args.rows + chunks - 1) / chunks;
    const dim3 block(kColumns, kRows);
    if (vector_path<T>(args.half, {x, bias, y})) {
      if constexpr (sizeof(T) == 2) {
        flat_forward<T>(device, x, bias, y, args.rows, args.half);
      } else {
        constexpr int kVec = vector_width<T>();
        forward_kernel<T, kVec><<<grid_for<kVec>(args.half, chunks), block, 0, cuda::stream(device)>>>(
            x, bias, y, args.rows, args.half, chunk_rows);
      }
    } else {
      forward_kernel<T, 1><<<grid_for<1>(args.half, chunks), block, 0, cuda::stream(device)>>>(
          x, bias, y, args.rows, args.half, chunk_rows);
    }
  });
  cuda::check_launch("fused_bias_swiglu_forward");
}

int64_t bias_grad_workspace_bytes(const Cuda& device, int64_t rows, int64_t half, Dtype dtype) {
  const int64_t acc_bytes = dtype == Dtype::kFloat64 ? sizeof(double) : sizeof(float);
  return row_chunks(device, rows, half) * 2 * half * acc_bytes;
}

void backward(const Cuda& device, const BackwardArgs& args) {
  const bool bias_grad = args.grad_bias != nullptr;
  if (args.half == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_t<T>;
    const auto* g = static_cast<const T*>(args.grad_y);
    const auto* x = static_cast<const T*>(args.x);
    const auto* bias = static_cast<const T*>(args.bias);
    auto* dx = static_cast<T*>(args.grad_x);
    auto* partials = static_cast<Acc*>(args.workspace);
    const int64_t chunks = row_chunks(device, args.rows, args.half);
    const int64_t chunk_rows = std::max<int64_t>(1, (args.rows + chunks - 1) / chunks);
    const dim3 block(kColumns, kRows);
    const cudaStream_t stream = cuda::stream(device);
    const auto run = [&](auto vec, auto with_bias_grad) {
      constexpr int kVec = decltype(vec)::value;
      constexpr bool kBiasGrad = decltype(with_bias_grad)::value;
      // 16-bit data on the vector path: grad_x alone by the one-shot kernel; with the bias gradient
      // by the chunk kernel (its per-column sums need the chunk loop), a dependent launch.
      if constexpr (sizeof(T) == 2 && kVec > 1 && !kBiasGrad) {
        flat_backward<T>(device, g, x, bias, dx, args.rows, args.half);
      } else if constexpr (sizeof(T) == 2 && kVec > 1) {
        cuda::launch_dependent(device, backward_kernel<T, kVec, kBiasGrad, true>, grid_for<kVec>(args.half, chunks),
                               block, 0, stream, g, x, bias, dx, partials, args.rows, args.half, chunk_rows);
      } else {
        backward_kernel<T, kVec, kBiasGrad><<<grid_for<kVec>(args.half, chunks), block, 0, stream>>>(
            g, x, bias, dx, partials, args.rows, args.half, chunk_rows);
      }
    };
    constexpr int kWide = vector_width<T>();
    const bool wide = vector_path<T>(args.half, {g, x, bias, dx});
    if (args.rows > 0) {  // no empty grid
      if (wide && bias_grad) run(std::integral_constant<int, kWide>{}, std::true_type{});
      if (wide && !bias_grad) run(std::integral_constant<int, kWide>{}, std::false_type{});
      if (!wide && bias_grad) run(std::integral_constant<int, 1>{}, std::true_type{});
      if (!wide && !bias_grad) run(std::integral_constant<int, 1>{}, std::false_type{});
    }
    if (bias_grad) {
      // With no rows, every chunk's partials are zeros: the fold reads none (chunks = 0) and writes 0.
      const int64_t width = 2 * args.half;
      const unsigned blocks = cuda::grid_size(width, kThreads, kBlocksPerSm, device);
      const int64_t folded = args.rows > 0 ? chunks : 0;
      if constexpr (sizeof(T) == 2) {
        cuda::launch_dependent(device, fold_bias_grad_kernel<T, true>, dim3(blocks), dim3(kThreads), 0, stream,
                               partials, static_cast<T*>(args.grad_bias), folded, width);
      } else {
        fold_bias_grad_kernel<T><<<blocks, kThreads, 0, stream>>>(partials, static_cast<T*>(args.grad_bias), folded,
                                                                  width);
      }
    }
  });
  cuda::check_launch("fused_bias_swiglu_backward");
}

}  // namespace apex::fused_swiglu
