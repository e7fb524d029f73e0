// CUDA back end of the multi-tensor apply engine.
//
// Host: the tensors of a call are described in a ChunkTable passed by value as the kernel
// argument (__grid_constant__, so nothing is copied per thread): the data pointers of every
// list, each tensor's numel and the running count of its chunks. CUDA >= 12.1 accepts 32 KB
// of kernel arguments, enough for ~600-1600 tensors (by depth) in one launch; longer lists
// take several launches.
//
// Device: a persistent grid (resident blocks of the kernel x SMs) strides over the chunks of
// all tensors. A block walks its chunk in tiles; each thread makes up to four independent
// 16-byte accesses of the widest list per tile (narrower lists load the same elements with
// 8/4-byte accesses), falling back to guarded scalar accesses when a tensor is
// not 16-byte aligned or at its ragged end. Values are converted to float (double for double
// lists), the functor runs per element, written lists are converted back and stored.
//
// Reductions write one partial per chunk; finish_norms_kernel then combines them per tensor
// and in total in a fixed order, so norms are deterministic run to run.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/DeviceUtils.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <utility>

#include "apex/multi_tensor_apply_common.h"
#include "apex/multi_tensor_math.h"

#if defined(USE_ROCM)
#define APEX_GRID_CONSTANT
#else
#define APEX_GRID_CONSTANT __grid_constant__
#endif

namespace apex::multi_tensor {
namespace cuda {

constexpr int kThreads = 256;
constexpr int kAccessBytes = 16;
// Elements a thread holds per list and tile: 4 independent 16-byte fp32 loads (2 for 16-bit
// lists, 4 x 2 for double) per list in flight per thread, which with several resident blocks
// is well over the bytes per SM that HBM3 needs in flight, while the registers of a
// 4- or 5-list optimizer step stay under the occupancy cliff.
constexpr int kMaxElemsPerThread = 16;
constexpr int kMaxAccessesPerThread = 4;

// Kernel-argument budget: 32764 bytes since CUDA 12.1 (Volta and newer); 4 KB before and on ROCm.
#if defined(USE_ROCM) || (defined(CUDART_VERSION) && CUDART_VERSION < 12010)
constexpr int kArgBytes = 4096;
#else
constexpr int kArgBytes = 32764;
#endif
// Room left for the functor and the other kernel arguments.
constexpr int kReservedArgBytes = 512;

template <int kDepth>
struct ChunkTable {
  static constexpr int kCapacity =
      (kArgBytes - kReservedArgBytes - 4 * static_cast<int>(sizeof(int64_t))) / (kDepth * 8 + 2 * 8);
  void* ptrs[kDepth][kCapacity];
  int64_t numel[kCapacity];
  int64_t chunk_end[kCapacity];  // chunks of tensor t: [chunk_end[t - 1], chunk_end[t]) within this launch
  int64_t chunk_elems;
  int64_t num_chunks;
  int64_t first_chunk;  // index of this launch's chunk 0 among all chunks of the call
  int num_tensors;
  int first_tensor;     // index of this launch's tensor 0 in the call's lists
};

template <class TL>
struct TileShape {
  static constexpr int kGroup = kAccessBytes / TL::kWidestBytes;  // elements per access of the widest list
  static constexpr int kAccesses = std::min(kMaxAccessesPerThread, kMaxElemsPerThread / kGroup);
  static constexpr int kElems = kGroup * kAccesses;  // elements per thread per tile
  static constexpr int kTile = kThreads * kElems;
};

template <class T, int N>
struct alignas(sizeof(T) * N) Packed {
  T v[N];
};

template <class F, int... I>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}

template <class Op, class M, int D, int E, size_t... I>
__device__ __forceinline__ auto call_op(const Op& op, M (&x)[D][E], int e, std::index_sequence<I...>) {
  return op(x[I][e]...);
}

// Thread's element k of access g in a tile starting at `tile`: tile + (g * kThreads + tid) * kGroup + k,
// so each access instruction of a warp covers one contiguous span.
template <class TL, class M>
__device__ __forceinline__ void load_tile(char* const (&base)[TL::kDepth], int64_t tile, int64_t end, bool aligned,
                                          ListMask reads, M (&x)[TL::kDepth][TileShape<TL>::kElems]) {
  using Shape = TileShape<TL>;
  static_for<TL::kDepth>([&](auto d) {
    using T = typename TL::template At<d>;
    if (!(reads & (ListMask{1} << d))) return;
    const T* p = reinterpret_cast<const T*>(base[d]);
#pragma unroll
    for (int g = 0; g < Shape::kAccesses; ++g) {
      const int64_t i = tile + (static_cast<int64_t>(g) * kThreads + threadIdx.x) * Shape::kGroup;
      if (aligned && i + Shape::kGroup <= end) {
        const auto packed = *reinterpret_cast<const Packed<T, Shape::kGroup>*>(p + i);
#pragma unroll
        for (int k = 0; k < Shape::kGroup; ++k) x[d][g * Shape::kGroup + k] = static_cast<M>(packed.v[k]);
      } else {
#pragma unroll
        for (int k = 0; k < Shape::kGroup; ++k) {
          x[d][g * Shape::kGroup + k] = i + k < end ? static_cast<M>(p[i + k]) : M(0);
        }
      }
    }
  });
}

template <class TL, class M>
__device__ __forceinline__ void store_tile(char* const (&base)[TL::kDepth], int64_t tile, int64_t end, bool aligned,
                                           ListMask writes, const M (&x)[TL::kDepth][TileShape<TL>::kElems]) {
  using Shape = TileShape<TL>;
  static_for<TL::kDepth>([&](auto d) {
    using T = typename TL::template At<d>;
    if (!(writes & (ListMask{1} << d))) return;
    T* p = reinterpret_cast<T*>(base[d]);
#pragma unroll
    for (int g = 0; g < Shape::kAccesses; ++g) {
      const int64_t i = tile + (static_cast<int64_t>(g) * kThreads + threadIdx.x) * Shape::kGroup;
      if (aligned && i + Shape::kGroup <= end) {
        Packed<T, Shape::kGroup> packed;
#pragma unroll
        for (int k = 0; k < Shape::kGroup; ++k) packed.v[k] = static_cast<T>(x[d][g * Shape::kGroup + k]);
        *reinterpret_cast<Packed<T, Shape::kGroup>*>(p + i) = packed;
      } else {
#pragma unroll
        for (int k = 0; k < Shape::kGroup; ++k) {
          if (i + k < end) p[i + k] = static_cast<T>(x[d][g * Shape::kGroup + k]);
        }
      }
    }
  });
}

template <Reduce R>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int offset = C10_WARP_SIZE / 2; offset > 0; offset /= 2) {
    v = combine_partials<R>(v, WARP_SHFL_XOR(v, offset));
  }
  return v;
}

// Combined value of `v` over the block, valid in thread 0. Safe to call repeatedly.
template <Reduce R>
__device__ float block_reduce(float v) {
  __shared__ float warp_values[kThreads / C10_WARP_SIZE];
  const int lane = threadIdx.x % C10_WARP_SIZE, warp = threadIdx.x / C10_WARP_SIZE;
  v = warp_reduce<R>(v);
  if (lane == 0) warp_values[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / C10_WARP_SIZE ? warp_values[lane] : 0.f;
    v = warp_reduce<R>(v);
  }
  __syncthreads();  // warp_values is reused by the next call
  return v;
}

// The engine's kernel. Elementwise functors (kReduce == kNone) ignore `partials`.
template <class TL, class Op>
__global__ void __launch_bounds__(kThreads)
    multi_tensor_kernel(const APEX_GRID_CONSTANT ChunkTable<TL::kDepth> table, int* noop_flag, const Op op,
                        float* partials, int64_t* tensor_chunk_end) {
  using M = typename TL::Math;
  using Shape = TileShape<TL>;
  constexpr int D = TL::kDepth;
  constexpr bool kReduces = Op::kReduce != Reduce::kNone;

  if constexpr (kReduces) {
    // Where each tensor's partials lie, for finish_norms_kernel.
    if (blockIdx.x == 0) {
      for (int t = threadIdx.x; t < table.num_tensors; t += kThreads) {
        tensor_chunk_end[table.first_tensor + t] = table.first_chunk + table.chunk_end[t];
      }
    }
  }
  // A skipping kernel leaves its partials unwritten; finish_norms_kernel then reports 0.
  if (Op::kSkipIfFlagSet && *static_cast<volatile int*>(noop_flag)) return;

  bool finite = true;
  int t = 0;
  for (int64_t c = blockIdx.x; c < table.num_chunks; c += gridDim.x) {
    while (c >= table.chunk_end[t]) ++t;
    const auto tensor_op = op.at_tensor(table.first_tensor + t);
    const int64_t first_chunk_of_tensor = t == 0 ? 0 : table.chunk_end[t - 1];
    const int64_t begin = (c - first_chunk_of_tensor) * table.chunk_elems;
    const int64_t end = min(begin + table.chunk_elems, table.numel[t]);
    char* base[D];
    bool aligned = true;
#pragma unroll
    for (int d = 0; d < D; ++d) {
      base[d] = static_cast<char*>(table.ptrs[d][t]);
      aligned = aligned && reinterpret_cast<uintptr_t>(base[d]) % kAccessBytes == 0;
    }

    float acc = 0.f;
    if (!tensor_op.skip()) {
      const ListMask reads = tensor_op.reads(), writes = tensor_op.writes(), checks = tensor_op.checks();
      for (int64_t tile = begin; tile < end; tile += Shape::kTile) {
        M x[D][Shape::kElems];
        load_tile<TL>(base, tile, end, aligned, reads, x);
        if (checks) {
#pragma unroll
          for (int d = 0; d < D; ++d) {
            if (checks & (ListMask{1} << d)) {
#pragma unroll
              for (int e = 0; e < Shape::kElems; ++e) finite = finite && VecMath<M>::isfinite(x[d][e]);
            }
          }
        }
#pragma unroll
        for (int e = 0; e < Shape::kElems; ++e) {
          if constexpr (kReduces) {
            acc = combine_partials<Op::kReduce>(acc, static_cast<float>(
                                                         call_op(tensor_op, x, e, std::make_index_sequence<D>{})));
          } else {
            call_op(tensor_op, x, e, std::make_index_sequence<D>{});
          }
        }
        store_tile<TL>(base, tile, end, aligned, writes, x);
      }
    }
    if constexpr (kReduces) {
      const float partial = block_reduce<Op::kReduce>(acc);
      if (threadIdx.x == 0) {
        partials[table.first_chunk + c] = partial;
        // As apex: a non-finite partial (inf/nan input or an overflowing sum) sets the flag.
        if (!VecMath<float>::isfinite(partial)) *noop_flag = 1;
      }
    }
  }
  // Racing writes of the same value are fine.
  if (!finite) *noop_flag = 1;
}

// One block: combines each tensor's chunk partials (a warp per tensor), writes the per-tensor
// results and the total.
template <Reduce R>
__global__ void __launch_bounds__(kThreads)
    finish_norms_kernel(const float* partials, const int64_t* tensor_chunk_end, int num_tensors,
                        const int* noop_flag, bool zero_if_flag_set, PerTensorOut mode, float keep, float take,
                        float* total, float* per_tensor) {
  const bool zero = zero_if_flag_set && *noop_flag != 0;
  const int lane = threadIdx.x % C10_WARP_SIZE, warp = threadIdx.x / C10_WARP_SIZE;
  constexpr int kWarps = kThreads / C10_WARP_SIZE;
  float mine = 0.f;
  for (int t = warp; t < num_tensors; t += kWarps) {
    float v = 0.f;
    if (!zero) {
      const int64_t first = t == 0 ? 0 : tensor_chunk_end[t - 1];
      for (int64_t i = first + lane; i < tensor_chunk_end[t]; i += C10_WARP_SIZE) {
        v = combine_partials<R>(v, partials[i]);
      }
      v = warp_reduce<R>(v);
    }
    if (lane == 0 && mode != PerTensorOut::kNone) {
      per_tensor[t] = per_tensor_result<R>(mode, per_tensor[t], v, keep, take);
    }
    mine = combine_partials<R>(mine, v);
  }
  const float combined = block_reduce<R>(lane == 0 ? mine : 0.f);
  if (threadIdx.x == 0) *total = finish_norm<R>(combined);
}

template <class F>
__global__ void run_once_kernel(const F f) {
  f();
}

// Blocks of `kernel` that fit on the device at once.
template <class Kernel>
int resident_blocks(Kernel kernel) {
  static const int per_sm = [&] {
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0));
    return std::max(blocks, 1);
  }();
  return per_sm * at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
}

// Launches `op` over all chunks of `lists`, as many tensors per launch as the table holds.
template <class TL, class Op>
void launch(const char* name, int64_t chunk_size, const at::Tensor& noop_flag,
            const std::vector<at::TensorList>& lists, const Op& op, float* partials, int64_t* tensor_chunk_end) {
  constexpr int D = TL::kDepth;
  using Table = ChunkTable<D>;
  static_assert(sizeof(Table) + sizeof(Op) + 3 * sizeof(void*) <= kArgBytes, "kernel arguments too large");

  auto kernel = multi_tensor_kernel<TL, Op>;
  const int64_t max_blocks = resident_blocks(kernel);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  constexpr bool kReduces = Op::kReduce != Reduce::kNone;
  int* flag = noop_flag.data_ptr<int>();

  Table table;
  table.chunk_elems = round_up(chunk_size, TileShape<TL>::kTile);
  table.num_chunks = table.first_chunk = 0;
  table.num_tensors = table.first_tensor = 0;
  auto flush = [&] {
    // A reduction launches even without chunks: it records where its tensors' (no) partials are.
    if (table.num_chunks > 0 || (kReduces && table.num_tensors > 0)) {
      const int64_t blocks = std::max<int64_t>(1, std::min(table.num_chunks, max_blocks));
      kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table, flag, op, partials, tensor_chunk_end);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    table.first_chunk += table.num_chunks;
    table.first_tensor += table.num_tensors;
    table.num_chunks = 0;
    table.num_tensors = 0;
  };
  for (size_t t = 0; t < lists[0].size(); ++t) {
    const int n = table.num_tensors;
    for (int d = 0; d < D; ++d) table.ptrs[d][n] = lists[d][t].data_ptr();
    table.numel[n] = lists[0][t].numel();
    table.num_chunks += (table.numel[n] + table.chunk_elems - 1) / table.chunk_elems;
    table.chunk_end[n] = table.num_chunks;
    table.num_tensors = n + 1;
    if (table.num_tensors == Table::kCapacity) flush();
  }
  flush();
}

template <class TL>
void check_lists(const char* name, int64_t chunk_size, const at::Tensor& noop_flag,
                 const std::vector<at::TensorList>& lists) {
  TORCH_CHECK(static_cast<int>(lists.size()) == TL::kDepth, name, ": expected ", TL::kDepth, " tensor lists, got ",
              lists.size());
  check_tensor_lists(name, chunk_size, noop_flag, lists);
  TORCH_CHECK(noop_flag.is_cuda(), name, ": CUDA kernel called with a flag on ", noop_flag.device());
}

}  // namespace cuda

struct CudaEngine {
  // Applies elementwise functor `op` to every element of the lists (element types TL).
  template <class TL, class Op>
  static void elementwise(const char* name, int64_t chunk_size, const at::Tensor& noop_flag,
                          const std::vector<at::TensorList>& lists, const Op& op) {
    cuda::check_lists<TL>(name, chunk_size, noop_flag, lists);
    const c10::cuda::CUDAGuard guard(noop_flag.device());
    cuda::launch<TL>(name, chunk_size, noop_flag, lists, op, nullptr, nullptr);
  }

  // Reduces the terms `op` returns (sum of squares -> L2 norm, or max of |x|), in total and per tensor.
  template <class TL, class Op>
  static NormOutputs reduce(const char* name, int64_t chunk_size, const at::Tensor& noop_flag,
                            const std::vector<at::TensorList>& lists, const Op& op, const NormRequest& request) {
    cuda::check_lists<TL>(name, chunk_size, noop_flag, lists);
    const c10::cuda::CUDAGuard guard(noop_flag.device());
    const int64_t num_tensors = static_cast<int64_t>(lists[0].size());
    const int64_t chunk_elems = round_up(chunk_size, cuda::TileShape<TL>::kTile);
    int64_t num_chunks = 0;
    for (const at::Tensor& x : lists[0]) num_chunks += (x.numel() + chunk_elems - 1) / chunk_elems;

    NormOutputs out = allocate_norm_outputs(name, num_tensors, noop_flag, request);
    const auto options = noop_flag.options();
    at::Tensor partials = at::empty({std::max<int64_t>(num_chunks, 1)}, options.dtype(at::kFloat));
    at::Tensor tensor_chunk_end = at::empty({num_tensors}, options.dtype(at::kLong));
    cuda::launch<TL>(name, chunk_size, noop_flag, lists, op, partials.data_ptr<float>(),
                     tensor_chunk_end.data_ptr<int64_t>());
    TORCH_CHECK(num_tensors <= std::numeric_limits<int>::max(), name, ": too many tensors");
    cuda::finish_norms_kernel<Op::kReduce><<<1, cuda::kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        partials.data_ptr<float>(), tensor_chunk_end.data_ptr<int64_t>(), static_cast<int>(num_tensors),
        noop_flag.data_ptr<int>(), request.zero_if_flag_set, request.per_tensor, request.keep, request.take,
        out.total.data_ptr<float>(), out.per_tensor.numel() ? out.per_tensor.data_ptr<float>() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
  }

  // Runs a one-off scalar update (amp's loss-scale bookkeeping) on the tensors' GPU.
  template <class F>
  static void run_once(const at::Tensor& on, const F& f) {
    TORCH_CHECK(on.is_cuda(), "CUDA kernel called with a tensor on ", on.device());
    const c10::cuda::CUDAGuard guard(on.device());
    cuda::run_once_kernel<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(f);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace apex::multi_tensor
