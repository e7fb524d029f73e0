// CUDA back end of the multi-tensor apply engine (torch-free: kernel sources include apex/cuda.cuh
// level headers only).
//
// Host: the tensors of a call are described in a TileTable passed by value as the kernel
// argument (__grid_constant__, so nothing is copied per thread): the data pointers of every
// list, each tensor's numel and the running count of its tiles. CUDA >= 12.1 accepts 32 KB
// of kernel arguments, enough for ~600-1300 tensors (by depth) in one launch; longer lists
// take several launches.
//
// Device: one wave of resident blocks (resident blocks of the kernel x SMs). The tiles of all
// tensors are numbered in list order and every block takes one contiguous run of them, the
// same count to within one tile, so all blocks finish together (apex's scheme, blocks striding
// over 64K-element chunks, ran the 5600 chunks of a GPT-sized model in 5.3 waves whose last
// one left most of the GPU idle). A thread makes a few independent 16-byte accesses of the
// widest list per tile (narrower lists load the same elements with 8/4-byte accesses), falling
// back to guarded scalar accesses when a tensor is not 16-byte aligned or at its ragged end.
// Values are converted to float (double for double lists), the functor runs per element,
// written lists are converted back and stored.
//
// Reductions: a block writes one partial per tensor it touches; finish_norms_kernel then
// combines them per tensor and in total in a fixed order, so norms are deterministic run to
// run on a given GPU. chunk_size only matters to the CPU engine: here the tiles are the unit.
#pragma once

#include <limits>
#include <stdexcept>
#include <utility>

#include "apex/cuda.cuh"
#include "apex/multi_tensor_kernel.h"

#if defined(USE_ROCM)
#define APEX_GRID_CONSTANT
#else
#define APEX_GRID_CONSTANT __grid_constant__
#endif

namespace apex::multi_tensor {
namespace cuda {

using apex::cuda::check_launch;
using apex::cuda::sm_count;
using apex::cuda::stream;

// Launch shape of the engine's kernels. It is a type so that benchmarks/optimizers/tuning can
// build variants side by side.
//   kThreads: threads per block.
//   kElemsFewLists / kElemsManyLists: elements a thread holds per list and tile, for kernels of
//       one or two lists / of more, when the widest list is 4 bytes wide (the same bytes for
//       double lists, at least one 16-byte access for 16-bit ones).
//   kMinBlocksPerSm: __launch_bounds__' residency request (caps registers per thread).
template <int Threads, int ElemsFewLists, int ElemsManyLists, int MinBlocksPerSm>
struct LaunchConfig {
  static constexpr int kThreads = Threads;
  static constexpr int kMinBlocksPerSm = MinBlocksPerSm;
  static constexpr int elems_per_thread(int lists) { return lists <= 2 ? ElemsFewLists : ElemsManyLists; }
};

// Measured on an H100 (benchmarks/optimizers/NOTES.md): norms and unscale (1-2 lists) move
// their bytes 1-2% faster with 32 elements (eight 16-byte loads in flight per thread) than
// with 16; optimizer steps (4-5 lists) need 16: 32 takes ~190 registers, one block per SM.
using DefaultLaunchConfig = LaunchConfig<256, 32, 16, 1>;

// The combine of per-tensor partials is one block; a warp per tensor, so more warps, fewer rounds.
constexpr int kFinishThreads = 1024;

// Kernel-argument budget: 32764 bytes since CUDA 12.1 (Volta and newer); 4 KB before and on ROCm.
#if defined(USE_ROCM) || (defined(CUDART_VERSION) && CUDART_VERSION < 12010)
constexpr int kArgBytes = 4096;
#else
constexpr int kArgBytes = 32764;
#endif
// Room left for the functor and the other kernel arguments.
constexpr int kReservedArgBytes = 512;

template <int kDepth>
struct TileTable {
  static constexpr int kCapacity =
      (kArgBytes - kReservedArgBytes - 2 * static_cast<int>(sizeof(int64_t)) - 2 * static_cast<int>(sizeof(int))) /
      (kDepth * 8 + 2 * 8);
  void* ptrs[kDepth][kCapacity];
  int64_t numel[kCapacity];
  int64_t tile_end[kCapacity];  // tensor t owns this launch's tiles [tile_end[t - 1], tile_end[t])
  int64_t num_tiles;
  int64_t first_slot;  // reductions: this launch's partial slot 0 among all slots of the call
  int num_tensors;
  int first_tensor;  // index of this launch's tensor 0 in the call's lists
};

template <class TL, class Config>
struct TileShape {
  static constexpr int kGroup = kVectorBytes / TL::kWidestBytes;  // elements per access of the widest list
  static constexpr int kElems =
      std::max(kGroup, Config::elems_per_thread(TL::kDepth) * 4 / std::max(4, TL::kWidestBytes));
  static constexpr int kAccesses = kElems / kGroup;
  static constexpr int kTile = Config::kThreads * kElems;  // elements per block and tile
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

// Thread's element k of access g in the tile starting at element `tile` of a tensor:
// tile + (g * kThreads + tid) * kGroup + k, so each access instruction of a warp covers one
// contiguous span.
template <class TL, class Config, class M>
__device__ __forceinline__ void load_tile(char* const (&base)[TL::kDepth], int64_t tile, int64_t end, bool aligned,
                                          ListMask reads, M (&x)[TL::kDepth][TileShape<TL, Config>::kElems]) {
  using Shape = TileShape<TL, Config>;
  static_for<TL::kDepth>([&](auto d) {
    using T = typename TL::template At<d>;
    if (!(reads & (ListMask{1} << d))) return;
    const T* p = reinterpret_cast<const T*>(base[d]);
#pragma unroll
    for (int g = 0; g < Shape::kAccesses; ++g) {
      const int64_t i = tile + (static_cast<int64_t>(g) * Config::kThreads + threadIdx.x) * Shape::kGroup;
      load_group<Shape::kGroup>(p, i, end, aligned, &x[d][g * Shape::kGroup]);
    }
  });
}

template <class TL, class Config, class M>
__device__ __forceinline__ void store_tile(char* const (&base)[TL::kDepth], int64_t tile, int64_t end, bool aligned,
                                           ListMask writes, const M (&x)[TL::kDepth][TileShape<TL, Config>::kElems]) {
  using Shape = TileShape<TL, Config>;
  static_for<TL::kDepth>([&](auto d) {
    using T = typename TL::template At<d>;
    if (!(writes & (ListMask{1} << d))) return;
    T* p = reinterpret_cast<T*>(base[d]);
#pragma unroll
    for (int g = 0; g < Shape::kAccesses; ++g) {
      const int64_t i = tile + (static_cast<int64_t>(g) * Config::kThreads + threadIdx.x) * Shape::kGroup;
      store_group<Shape::kGroup>(p, i, end, aligned, &x[d][g * Shape::kGroup]);
    }
  });
}

template <Reduce R>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int offset = C10_WARP_SIZE / 2; offset > 0; offset /= 2) {
#if defined(USE_ROCM)
    v = combine_partials<R>(v, __shfl_xor(v, offset));
#else
    v = combine_partials<R>(v, __shfl_xor_sync(0xffffffff, v, offset));
#endif
  }
  return v;
}

// Combined value of `v` over a block of kThreads threads, valid in thread 0. Safe to call repeatedly.
template <Reduce R, int kThreads>
__device__ float block_reduce(float v) {
  constexpr int kWarps = kThreads / C10_WARP_SIZE;
  __shared__ float warp_values[kWarps];
  const int lane = threadIdx.x % C10_WARP_SIZE, warp = threadIdx.x / C10_WARP_SIZE;
  v = warp_reduce<R>(v);
  if (lane == 0) warp_values[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? warp_values[lane] : 0.f;
    v = warp_reduce<R>(v);
  }
  __syncthreads();  // warp_values is reused by the next call
  return v;
}

// The grid's split of the launch's tiles: block b takes [num_tiles * b / blocks, num_tiles * (b + 1) / blocks).
__device__ __forceinline__ int64_t first_tile_of_block(int64_t block, int64_t blocks, int64_t num_tiles) {
  return num_tiles * block / blocks;
}
// The block whose run holds tile x: the largest b with first_tile_of_block(b) <= x.
__device__ __forceinline__ int64_t block_of_tile(int64_t x, int64_t blocks, int64_t num_tiles) {
  return ((x + 1) * blocks - 1) / num_tiles;
}

// The first of `count` tensors whose work ends after unit `x` (`ends`: each tensor's running end of
// work units, sorted; tensors without units are skipped): the tensor unit x belongs to.
__device__ __forceinline__ int tensor_of_unit(const int64_t* ends, int count, int64_t x) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (ends[mid] > x) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Block b writes its partial of tensor t into slot first_slot + b + t. Along the tiles b and t
// never decrease and one of them grows at each new (block, tensor) segment, so slots are
// distinct, and tensor t's partials are the consecutive slots of the blocks that cover it.
// Records [first, end) of those slots for every tensor of the launch.
template <int D, int kThreads>
__device__ void record_slot_ranges(const TileTable<D>& table, int* slot_ranges) {
  const int64_t blocks = gridDim.x;
  for (int t = threadIdx.x; t < table.num_tensors; t += kThreads) {
    const int64_t first = t == 0 ? 0 : table.tile_end[t - 1], end = table.tile_end[t];
    int64_t begin_slot = 0, end_slot = 0;
    if (end > first) {
      begin_slot = table.first_slot + block_of_tile(first, blocks, table.num_tiles) + t;
      end_slot = table.first_slot + block_of_tile(end - 1, blocks, table.num_tiles) + t + 1;
    }
    slot_ranges[2 * (table.first_tensor + t)] = static_cast<int>(begin_slot);
    slot_ranges[2 * (table.first_tensor + t) + 1] = static_cast<int>(end_slot);
  }
}

// The engine's kernel. Elementwise functors (kReduce == kNone) ignore `partials` and `slot_ranges`.
template <class TL, class Op, class Config>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSm)
    multi_tensor_kernel(const APEX_GRID_CONSTANT TileTable<TL::kDepth> table, int* noop_flag, const Op op,
                        float* partials, int* slot_ranges) {
  using M = typename TL::Math;
  using Shape = TileShape<TL, Config>;
  constexpr int D = TL::kDepth;
  constexpr bool kReduces = Op::kReduce != Reduce::kNone;

  if constexpr (kReduces) {
    if (blockIdx.x == 0) record_slot_ranges<D, Config::kThreads>(table, slot_ranges);
  }
  // A skipping kernel leaves its partials unwritten; finish_norms_kernel then reports 0.
  if (op.skip_if_flag_set() && *static_cast<volatile int*>(noop_flag)) return;

  const int64_t blocks = gridDim.x;
  const int64_t last = first_tile_of_block(blockIdx.x + 1, blocks, table.num_tiles);
  int64_t tile = first_tile_of_block(blockIdx.x, blocks, table.num_tiles);
  bool finite = true;
  for (int t = tile < last ? tensor_of_unit(table.tile_end, table.num_tensors, tile) : 0; tile < last; ++t) {
    while (table.tile_end[t] <= tile) ++t;  // empty tensors own no tiles
    const int64_t tensor_first_tile = t == 0 ? 0 : table.tile_end[t - 1];
    const int64_t stop = min(last, table.tile_end[t]);
    const int64_t numel = table.numel[t];
    char* base[D];
    bool aligned = true;
#pragma unroll
    for (int d = 0; d < D; ++d) {
      base[d] = static_cast<char*>(table.ptrs[d][t]);
      aligned = aligned && reinterpret_cast<uintptr_t>(base[d]) % kVectorBytes == 0;
    }

    float acc = 0.f;
    const auto tensor_op = op.at_tensor(table.first_tensor + t);
    if (!tensor_op.skip()) {
      const ListMask reads = tensor_op.reads(), writes = tensor_op.writes(), checks = tensor_op.checks();
      for (; tile < stop; ++tile) {
        const int64_t start = (tile - tensor_first_tile) * Shape::kTile;
        M x[D][Shape::kElems];
        load_tile<TL, Config>(base, start, numel, aligned, reads, x);
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
        store_tile<TL, Config>(base, start, numel, aligned, writes, x);
      }
    }
    tile = stop;
    if constexpr (kReduces) {
      const float partial = block_reduce<Op::kReduce, Config::kThreads>(acc);
      if (threadIdx.x == 0) {
        partials[table.first_slot + blockIdx.x + t] = partial;
        // As apex: a non-finite partial (inf/nan input or an overflowing sum) sets the flag.
        if (!VecMath<float>::isfinite(partial)) *noop_flag = 1;
      }
    }
  }
  // Racing writes of the same value are fine.
  if (!finite) *noop_flag = 1;
}

// One block: combines each tensor's partials (a warp per tensor), writes the per-tensor results
// and the total. `zero` (a skipped l2norm_mp) reports 0 without reading the unwritten partials.
template <Reduce R>
__global__ void __launch_bounds__(kFinishThreads)
    finish_norms_kernel(const float* partials, const int* slot_ranges, int num_tensors, const int* noop_flag,
                        bool zero_if_flag_set, PerTensorOut mode, float keep, float take, float* total,
                        float* per_tensor) {
  const bool zero = zero_if_flag_set && *noop_flag != 0;
  const int lane = threadIdx.x % C10_WARP_SIZE, warp = threadIdx.x / C10_WARP_SIZE;
  constexpr int kWarps = kFinishThreads / C10_WARP_SIZE;
  float mine = 0.f;
  for (int t = warp; t < num_tensors; t += kWarps) {
    float v = 0.f;
    if (!zero) {
      for (int i = slot_ranges[2 * t] + lane; i < slot_ranges[2 * t + 1]; i += C10_WARP_SIZE) {
        v = combine_partials<R>(v, partials[i]);
      }
      v = warp_reduce<R>(v);
    }
    if (lane == 0 && mode != PerTensorOut::kNone) {
      per_tensor[t] = per_tensor_result<R>(mode, per_tensor[t], v, keep, take);
    }
    mine = combine_partials<R>(mine, v);
  }
  const float combined = block_reduce<R, kFinishThreads>(lane == 0 ? mine : 0.f);
  if (threadIdx.x == 0) *total = finish_norm<R>(combined);
}

template <class F>
__global__ void run_once_kernel(const F f) {
  f();
}

// A per-device value computed once (the occupancy of a kernel, a device attribute).
template <class F>
int per_device(int (&cache)[64], int device, F&& compute) {
  if (device < 0 || device >= 64) return compute();
  if (cache[device] == 0) cache[device] = compute();
  return cache[device];
}

inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": CUDA error: " + cudaGetErrorString(error));
}

// Blocks of the engine's kernel for (TL, Op, Config) resident on `device` at once.
template <class TL, class Op, class Config>
int64_t resident_blocks(const Cuda& device) {
  static int cache[64] = {};
  const int per_sm = per_device(cache, device.device, [] {
    int blocks = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, multi_tensor_kernel<TL, Op, Config>,
                                                             Config::kThreads, 0),
               "multi-tensor kernel occupancy");
    return std::max(blocks, 1);
  });
  return static_cast<int64_t>(per_sm) * sm_count(device.device);
}

// An upper bound of resident_blocks() for any kernel of Config's block size.
template <class Config>
int64_t max_resident_blocks(const Cuda& device) {
  static int cache[64] = {};
  const int threads_per_sm = per_device(cache, device.device, [&] {
    int threads = 0;
    check_cuda(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device.device),
               "multi-tensor reduction scratch");
    return std::max(threads, Config::kThreads);
  });
  return static_cast<int64_t>(threads_per_sm / Config::kThreads) * sm_count(device.device);
}

// Floats of scratch a reduction over `count` tensors needs: the partial slots (see
// record_slot_ranges) of every launch, then each tensor's [first, end) slot range as ints.
template <class Config>
int64_t reduction_scratch_for(const Cuda& device, int64_t count) {
  constexpr int64_t kCapacity = TileTable<2>::kCapacity;  // reductions take one or two lists
  const int64_t launches = (count + kCapacity - 1) / kCapacity;
  return launches * max_resident_blocks<Config>(device) + count + 2 * count;
}

// Launches `op` over all tiles of `lists`, as many tensors per launch as the table holds.
template <class TL, class Op, class Config>
void launch(const Cuda& device, const TensorLists& lists, int* flag, const Op& op, float* partials,
            int* slot_ranges) {
  constexpr int D = TL::kDepth;
  using Table = TileTable<D>;
  static_assert(sizeof(Table) + sizeof(Op) + 3 * sizeof(void*) <= kArgBytes, "kernel arguments too large");
  constexpr int64_t kTile = TileShape<TL, Config>::kTile;
  constexpr bool kReduces = Op::kReduce != Reduce::kNone;

  const int64_t max_blocks = resident_blocks<TL, Op, Config>(device);
  Table table;
  table.num_tiles = table.first_slot = 0;
  table.num_tensors = table.first_tensor = 0;
  auto flush = [&] {
    // A reduction launches even without tiles: it records that its tensors have no partials.
    if (table.num_tiles > 0 || (kReduces && table.num_tensors > 0)) {
      const int64_t blocks = std::max<int64_t>(1, std::min(table.num_tiles, max_blocks));
      multi_tensor_kernel<TL, Op, Config><<<static_cast<unsigned>(blocks), Config::kThreads, 0, stream(device)>>>(
          table, flag, op, partials, slot_ranges);
      check_launch(lists.op);
      table.first_slot += blocks + table.num_tensors;
    }
    table.first_tensor += table.num_tensors;
    table.num_tiles = 0;
    table.num_tensors = 0;
  };
  for (int64_t t = 0; t < lists.count; ++t) {
    const int n = table.num_tensors;
    for (int d = 0; d < D; ++d) table.ptrs[d][n] = lists.at(d, t);
    table.numel[n] = lists.numel[t];
    table.num_tiles += (table.numel[n] + kTile - 1) / kTile;
    table.tile_end[n] = table.num_tiles;
    table.num_tensors = n + 1;
    if (table.num_tensors == Table::kCapacity) flush();
  }
  flush();
}

}  // namespace cuda

// The CUDA engine with launch shape Config (see cuda::LaunchConfig); kernels use CudaEngine.
template <class Config>
struct CudaEngineWith {
  // Applies elementwise functor `op` to every element of the lists (element types TL).
  template <class TL, class Op>
  static void elementwise(const Cuda& device, const TensorLists& lists, int* flag, const Op& op) {
    cuda::launch<TL, Op, Config>(device, lists, flag, op, nullptr, nullptr);
  }

  // Reduces the terms `op` returns (sum of squares -> L2 norm, or max of |x|), in total and per
  // tensor; `out.scratch` holds reduction_scratch() floats.
  template <class TL, class Op>
  static void reduce(const Cuda& device, const TensorLists& lists, int* flag, const Op& op, const NormOut& out) {
    const int64_t slots = cuda::reduction_scratch_for<Config>(device, lists.count) - 2 * lists.count;
    if (slots + 2 * lists.count > std::numeric_limits<int>::max()) {
      throw std::invalid_argument(std::string(lists.op) + ": too many tensors (" + std::to_string(lists.count) + ")");
    }
    float* partials = out.scratch;
    int* slot_ranges = reinterpret_cast<int*>(partials + slots);
    cuda::launch<TL, Op, Config>(device, lists, flag, op, partials, slot_ranges);
    cuda::finish_norms_kernel<Op::kReduce><<<1, cuda::kFinishThreads, 0, cuda::stream(device)>>>(
        partials, slot_ranges, static_cast<int>(lists.count), flag, out.zero_if_flag_set, out.mode, out.keep,
        out.take, out.total, out.per_tensor);
    cuda::check_launch(lists.op);
  }

  // Runs a one-off scalar update (amp's loss-scale bookkeeping) on the device.
  template <class F>
  static void run_once(const Cuda& device, const F& f) {
    cuda::run_once_kernel<<<1, 1, 0, cuda::stream(device)>>>(f);
    cuda::check_launch("multi-tensor scalar update");
  }
};

using CudaEngine = CudaEngineWith<cuda::DefaultLaunchConfig>;

}  // namespace apex::multi_tensor
