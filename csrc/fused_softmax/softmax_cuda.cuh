#pragma once
// fused_softmax: what the forward and backward CUDA kernels share.
//
// Three kernel shapes, picked per call by run_rows():
//  - warp kernel (rows up to kWarpForwardVectors / kWarpBackwardVectors 16-byte vectors per lane):
//    `group` lanes (a power of two up to a warp) per row, the row in registers as loaded (16-bit data
//    stays packed). A lane takes kRows rows at once (kPacks vectors each, kRows * kPacks up to the
//    lane's vector budget), issuing every load of all of them before using any: 4 KB per warp in
//    flight (forward) where one 1 KB row gave 1 KB, which left HBM waiting. Reductions are lane
//    shuffles. Forward rows without a causal bound whose lanes' rows are evenly spaced in memory take
//    warp_forward_once instead (softmax_forward.cuh: stepped offsets, each exponential computed once).
//  - row kernel (longer rows, up to a cluster of kMaxCluster blocks of kMaxRowThreads, vector data
//    only): one block per row, or on Hopper (sm_90) a thread-block cluster, each block one chunk.
//    The row stays in registers (kRowForwardVectors / kRowBackwardVectors vectors per thread) and
//    the block loads its next row while it reduces and writes the current one, so a block of 1024
//    threads keeps 64 KB of loads in flight through its barriers. Clusters combine statistics by
//    asynchronous stores into each other's shared memory (st.async, completed on an mbarrier): no
//    cluster barrier, whose release fence would wait for the row's stores and the next row's loads.
//  - block kernel (what the row kernel cannot take: rows longer than a cluster's registers hold,
//    GPUs without clusters, unaligned data): one block per row or per cluster, each thread staging
//    what it loads in shared memory during the first pass (the row's statistics), so the second
//    pass (the output) reads shared memory, not HBM: every element is read once and written once,
//    for any row length that fits the cluster's shared memory. Rows longer than that (or longer
//    than one block's shared memory before Hopper) take the same kernel unstaged: the second pass
//    reads the row from global memory again.
// Data stays in registers as loaded (Packed) and is converted to float where used; exp(x) is
// computed as exp2(x * log2(e)) (one FFMA, one MUFU.EX2). The forward warp and row kernels (positive
// scales) overwrite the elements that take no part with -inf once, in place, instead of selecting per
// element in every pass; softmax_forward.cuh says how.
//
// Row order: with a mask shared by the heads ([b, 1, sq, sk]), the warp and row kernels visit rows
// head-fastest, (b, q, h), so consecutive rows of a lane or block use one mask row: it is read once
// per lane (warp kernel: the kRows rows of a lane) or once per run of heads (row kernel: each block
// takes a contiguous range of rows and reloads the mask only when its row changes).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#if !defined(USE_ROCM)
#include <cooperative_groups.h>
#endif

#include "apex/block_reduce.cuh"
#include "apex/cuda.cuh"
#include "apex/fast_exp2.cuh"
#include "apex/occupancy.cuh"
#include "fused_softmax.h"

namespace apex::fused_softmax {

// Warp kernel blocks: 4 warps, so small grids still fill every SM.
constexpr int kWarpKernelThreads = 128;
// 16-byte vectors a warp-kernel lane loads per iteration, per tensor read: forward 8 (x), backward
// 4 (grad_y and y: 8 in all). They bound the row the warp kernel takes (forward 8 vectors per lane:
// 2048 bf16/fp16 or 1024 fp32 columns; backward 4: 1024 / 512) and, for shorter rows, how many rows
// a lane takes at once (budget / vectors per row, at most kMaxRowsPerLane). 8 vectors x 16 B x 32
// lanes = 4 KB of loads per warp; the data stays packed as loaded (forward bf16: 32 registers).
constexpr int kWarpForwardVectors = 8;
constexpr int kWarpBackwardVectors = 4;
// Rows a warp-kernel lane takes at once, at most: each costs a few registers of its own (keep bits,
// statistics, the mask row's state), and 8 one-vector rows took 126 registers (bf16), 4 take ~90.
constexpr int kMaxRowsPerLane = 4;
// Warp-kernel blocks per SM the register budget must allow (96 registers a thread): 20 warps of
// up to 4 KB of loads each. At 6 (80 registers) the multi-row instances spilled.
constexpr int kMinWarpBlocksPerSm = 5;
// Row kernel: at most this many threads per block (its launch bounds: one such block per SM, 64
// registers a thread), each holding this many 16-byte vectors of the row per tensor, twice (the
// row being reduced and the next row's loads): forward 4 (x: 64 KB per 1024 threads, 32768
// bf16 columns per block), backward 2 (grad_y and y: 16384 bf16 columns per block).
constexpr int kMaxRowThreads = 1024;
constexpr int kRowForwardVectors = 4;
constexpr int kRowBackwardVectors = 2;
// Block kernel: at most this many threads, at least this many (two ROCm wavefronts).
constexpr int kMaxBlockThreads = 512;
constexpr int kMinBlockThreads = 128;
// Blocks of kMaxBlockThreads resident per SM the register budget must allow (64 registers each):
// while one block reduces, another loads.
constexpr int kMinBlocksPerSm = 2;
// Vectors per thread the block kernel aims for (its thread count follows from the chunk).
constexpr int kVectorsPerThread = 4;
// 16-byte loads of each input a block-kernel thread issues before using any (forward: one input,
// backward: two): 64 B per thread, >= 64 KB per SM in flight with 1024+ resident threads, what
// HBM3 needs to reach copy bandwidth.
constexpr int kForwardUnroll = 4;
constexpr int kBackwardUnroll = 2;
// Shared memory a staged chunk may take: two blocks per H100 SM (228 KB), so one block's
// reductions overlap the other's loads. Longer rows are split over a cluster instead (the fewest
// blocks that fit: each row costs the cluster two cluster-wide barriers).
constexpr int64_t kStageBudgetBytes = 96 * 1024;
// Largest portable thread-block cluster.
constexpr int kMaxCluster = 8;
// Shared memory the block kernels declare themselves (reduction scratch: 16 warps' 8-byte partials
// and two slots, 144 bytes), which a staged chunk leaves free of a block's opt-in maximum.
constexpr int64_t kStaticSharedBytes = 256;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -INFINITY;

// ---- how a call spreads its rows (host) --------------------------------------------------------

enum class Shape { kWarp, kRow, kBlock };

struct Plan {
  Shape shape;
  int vec;         // elements per vector: vector_width<T>() or 1 (unaligned data)
  int packs;       // warp kernel: vectors per row per lane (a power of two up to the lane's budget)
  int group;       // warp kernel: lanes per row
  int threads;     // row and block kernels: threads per block
  int cluster;     // row and block kernels: blocks per row (1: no cluster)
  int64_t chunk;   // row and block kernels: columns per block (a multiple of vec)
  bool staged;     // block kernel: the chunk is kept in shared memory between the passes
  size_t smem;     // block kernel: dynamic shared memory per block, bytes
};

struct DeviceInfo {
  int major;        // compute capability
  int max_smem;     // opt-in shared memory per block, bytes
};

inline DeviceInfo device_info(int device) {
  constexpr int kMaxDevices = 64;
  static DeviceInfo cached[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) device = 0;
  if (cached[device].major == 0) {
    int major = 0, smem = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cached[device] = {major > 0 ? major : 1, smem > 0 ? smem : 48 * 1024};
  }
  return cached[device];
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int pow2_at_least(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// Whether `kernel` may run as thread-block clusters here: a Hopper-or-newer GPU, and code compiled
// for one (a build without sm_90 code runs older PTX on Hopper, where the cluster code is absent).
template <class Kernel>
bool supports_clusters(Kernel kernel, const Cuda& device) {
#if defined(USE_ROCM)
  return false;
#else
  if (device_info(device.device).major < 9) return false;
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    cudaGetLastError();  // clear it: the launch below must not report it
    return false;
  }
  return attributes.ptxVersion >= 90;
#endif
}

// Clusters of `cluster` blocks of `kernel` (`threads` each, no dynamic shared memory) the device
// runs at once, asked once per kernel, shape and device. Not sm_count / cluster: a cluster's blocks
// share a GPC, and SMs a GPC cannot fill with whole clusters stay idle; a persistent grid sized
// past what is resident would run its last clusters as a second wave. 0: the shape cannot run.
template <class Kernel>
int resident_clusters(Kernel kernel, int threads, int cluster, const Cuda& device) {
#if defined(USE_ROCM)
  return 0;
#else
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int, int>, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), threads, cluster, device.device);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    clusters = 0;
  }
  cache.emplace(key, clusters);
  return clusters;
#endif
}

// The warp kernel's plan for rows of `vectors` vectors.
inline void plan_warp(Plan& plan, int64_t vectors) {
  plan.shape = Shape::kWarp;
  plan.packs = vectors <= C10_WARP_SIZE ? 1 : pow2_at_least(ceil_div(vectors, C10_WARP_SIZE));
  plan.group = plan.packs == 1 ? pow2_at_least(vectors) : C10_WARP_SIZE;
}

// The row kernel's plan, if it can take rows of `vectors` vectors in `cluster` blocks: the chunk
// of each block, and threads for row_vectors vectors each (whole warps).
inline void plan_row(Plan& plan, int64_t vectors, int row_vectors, int cluster) {
  plan.shape = Shape::kRow;
  plan.cluster = cluster;
  const int64_t chunk_vectors = ceil_div(vectors, cluster);
  plan.chunk = chunk_vectors * plan.vec;
  plan.threads = cuda::whole_warps(static_cast<int>(ceil_div(chunk_vectors, row_vectors)));
  plan.staged = false;
  plan.smem = 0;
}

// The block kernel's plan. `stage_bytes_per_column`: shared memory a staged column takes (forward:
// the element plus its bit of the keep mask; backward: two elements).
inline void plan_block(Plan& plan, int64_t cols, double stage_bytes_per_column, const Cuda& device, bool clusters) {
  plan.shape = Shape::kBlock;
  const int vec = plan.vec;
  const DeviceInfo info = device_info(device.device);
  const auto bytes = [&](int cluster) {
    return static_cast<int64_t>(ceil_div(ceil_div(cols, cluster), vec) * vec * stage_bytes_per_column) + 16;
  };
  // The fewest blocks per row whose chunks fit the budget; else the most a cluster (or, without
  // clusters, one block) has; else unstaged. Staged chunks must fit the device (Turing's blocks
  // opt in to 64 KB only, less than the budget).
  int cluster = 1;
  while (bytes(cluster) > kStageBudgetBytes && clusters && cluster < kMaxCluster) cluster *= 2;
  plan.staged = bytes(cluster) <= info.max_smem - kStaticSharedBytes;
  if (!plan.staged) cluster = 1;
  plan.cluster = cluster;
  plan.chunk = ceil_div(ceil_div(cols, cluster), vec) * vec;
  plan.smem = plan.staged ? static_cast<size_t>(bytes(cluster)) : 0;
  const int64_t chunk_vectors = plan.chunk / vec;
  plan.threads = static_cast<int>(std::min<int64_t>(
      kMaxBlockThreads, std::max<int64_t>(kMinBlockThreads, pow2_at_least(ceil_div(chunk_vectors, kVectorsPerThread)))));
}

// Launches kernel<<<blocks, plan.threads, smem>>>(args..., plan), plan.cluster blocks per cluster.
template <class Kernel, class... Args>
void launch_clustered(Kernel kernel, const Plan& plan, int64_t blocks, size_t smem, const Cuda& device,
                      const char* op, const Args&... args) {
  const cudaStream_t stream = cuda::stream(device);
  if (plan.cluster == 1) {
    kernel<<<static_cast<unsigned>(blocks), plan.threads, smem, stream>>>(args..., plan);
  } else {
#if !defined(USE_ROCM)
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(plan.threads);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = plan.cluster;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    const cudaError_t error = cudaLaunchKernelEx(&config, kernel, args..., plan);
    if (error != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string(op) + ": cluster launch failed: " + cudaGetErrorString(error));
    }
#endif
  }
  cuda::check_launch(op);
}

// The block kernel: blocks = one per row up to what is resident at once (the kernel loops over rows).
template <class Kernel, class Args>
void launch_block_kernel(Kernel kernel, const Plan& plan, const Args& args, const Cuda& device, const char* op) {
  // Also opts the kernel in to more than the default 48 KB of dynamic shared memory where plan.smem needs it.
  const int resident =
      cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), plan.threads, plan.smem, device.device);
  const int64_t most = std::max<int64_t>(1, static_cast<int64_t>(cuda::sm_count(device.device)) * resident / plan.cluster);
  const int64_t blocks = std::max<int64_t>(1, std::min(args.rows, most)) * plan.cluster;
  launch_clustered(kernel, plan, blocks, plan.smem, device, op, args);
}

// The row kernel: persistent, one block (cluster) per row up to what is resident at once, each
// taking a contiguous range of rows (strided for causal rows, whose lengths grow with the row).
// `clusters`: resident_clusters() of the plan's shape (cluster > 1).
template <class Kernel, class Args>
void launch_row_kernel(Kernel kernel, const Plan& plan, int clusters, const Args& args, const Cuda& device,
                       const char* op) {
  int64_t resident = clusters;
  if (plan.cluster == 1) {
    resident = static_cast<int64_t>(cuda::sm_count(device.device)) *
               cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), plan.threads, 0, device.device);
  }
  const int64_t blocks = std::max<int64_t>(1, std::min(args.rows, resident)) * plan.cluster;
  launch_clustered(kernel, plan, blocks, 0, device, op, args);
}

// Rows a warp-kernel lane takes at once for kPacks vectors per row of a lane budget of kBudget.
constexpr int rows_per_lane(int budget, int packs) {
  return budget / packs < kMaxRowsPerLane ? budget / packs : kMaxRowsPerLane;
}

// Launches the warp kernel instance for plan.packs: kernels[k] is the one for 2^k vectors per row
// per lane (and rows_per_lane(2^(kInstances-1), 2^k) rows per lane). One pass over the rows: each
// lane group takes one set of rows, and the block scheduler balances the SMs (a grid capped at what
// is resident, looping, leaves up to one iteration of imbalance between warps at the end).
template <class Args, size_t kInstances>
void launch_warp_kernel(void (*const (&kernels)[kInstances])(Args, int), const Plan& plan, const Args& args,
                        const Cuda& device, const char* op) {
  size_t index = 0;
  while ((1 << index) < plan.packs && index + 1 < kInstances) ++index;
  const int64_t units = ceil_div(args.rows, rows_per_lane(1 << (kInstances - 1), 1 << index));
  const int64_t units_per_block = kWarpKernelThreads / C10_WARP_SIZE * (C10_WARP_SIZE / plan.group);
  constexpr int64_t kMaxGrid = 0x7fffffff;  // gridDim.x; the kernel loops past it
  const int64_t blocks = std::min(ceil_div(units, units_per_block), kMaxGrid);
  kernels[index]<<<static_cast<unsigned>(blocks), kWarpKernelThreads, 0, cuda::stream(device)>>>(args, plan.group);
  cuda::check_launch(op);
}

// Runs a forward or backward over args.rows rows of args.cols: the warp kernel instance for the
// plan's vectors per row (warp_kernels[k]: 2^k, with rows_per_lane() rows per lane), the
// row kernel (`row_kernel`, null where the data is not in vectors: it takes only vector data, the
// block kernel the rest), or the block kernel. `row_vectors`: vectors per thread per tensor of the
// row kernel; `stage_bytes_per_column`: see plan_block.
template <class Args, class RowKernel, class BlockKernel, size_t kInstances>
void run_rows(const Args& args, const Cuda& device, int vec, int row_vectors, double stage_bytes_per_column,
              RowKernel row_kernel, BlockKernel block_kernel, void (*const (&warp_kernels)[kInstances])(Args, int),
              const char* op) {
  Plan plan{};
  plan.vec = vec;
  const int64_t vectors = ceil_div(args.cols, vec);
  if (vectors <= int64_t{C10_WARP_SIZE} << (kInstances - 1)) {
    plan_warp(plan, vectors);
    launch_warp_kernel(warp_kernels, plan, args, device, op);
    return;
  }
  if (row_kernel != nullptr) {
    // The fewest blocks (a power of two, a cluster past one) whose threads hold the row.
    const int64_t per_block = int64_t{kMaxRowThreads} * row_vectors;
    int cluster = 1;
    while (cluster < kMaxCluster && cluster * per_block < vectors) cluster *= 2;
    if (cluster * per_block >= vectors && (cluster == 1 || supports_clusters(row_kernel, device))) {
      plan_row(plan, vectors, row_vectors, cluster);
      const int clusters = cluster == 1 ? 1 : resident_clusters(row_kernel, plan.threads, cluster, device);
      if (clusters > 0) {
        launch_row_kernel(row_kernel, plan, clusters, args, device, op);
        return;
      }
    }
  }
  plan_block(plan, args.cols, stage_bytes_per_column, device, supports_clusters(block_kernel, device));
  launch_block_kernel(block_kernel, plan, args, device, op);
}

// Whether the vector path may run: cols a multiple of the width and every pointer 16-byte aligned.
template <class T>
bool vector_path(int64_t cols, std::initializer_list<const void*> pointers) {
  if (cols % vector_width<T>() != 0) return false;
  for (const void* p : pointers) {
    if (!is_aligned(p)) return false;
  }
  return true;
}

// ---- device helpers ----------------------------------------------------------------------------

// n / d and n % d; 32-bit division (a few instructions) when both fit, as they nearly always do,
// rather than the 64-bit routine (~70).
C10_DEVICE C10_ALWAYS_INLINE void div_mod(int64_t n, int64_t d, int64_t& quotient, int64_t& remainder) {
  if (((n | d) >> 32) == 0) {
    const uint32_t q = static_cast<uint32_t>(n) / static_cast<uint32_t>(d);
    quotient = q;
    remainder = n - static_cast<int64_t>(q) * d;
  } else {
    quotient = n / d;
    remainder = n - quotient * d;
  }
}

// How a warp kernel's lanes share work: `group` neighbouring lanes per set of rows, the warp's sets
// consecutive, warps striding over them. Every lane runs every iteration (the shuffles need the
// whole warp): `first` is the warp's first set of the first iteration, first + slot this lane's
// (idle when past the last).
// A loop over block_first (first - warp_offset) instead runs the same iterations in every warp of the
// block, a trip count ptxas sees as warp-uniform: warp votes inside need no convergence check.
struct WarpRows {
  int member;          // this lane's index in its group
  int slot;            // this lane's group in the warp
  int64_t first;       // the warp's first set of the first iteration
  int64_t step;        // sets between iterations
  int64_t block_first;  // the block's first set of the first iteration
  int warp_offset;      // first - block_first
  C10_DEVICE explicit WarpRows(int group) {
    const int lane = threadIdx.x % C10_WARP_SIZE;
    const int per_warp = C10_WARP_SIZE / group;
    member = lane % group;
    slot = lane / group;
    block_first = static_cast<int64_t>(blockIdx.x) * (blockDim.x / C10_WARP_SIZE) * per_warp;
    warp_offset = static_cast<int>(threadIdx.x / C10_WARP_SIZE) * per_warp;
    first = block_first + warp_offset;
    step = static_cast<int64_t>(gridDim.x) * blockDim.x / C10_WARP_SIZE * per_warp;
  }
};

// The rows a row-kernel block (or cluster) takes: a contiguous range of the row order, or, for
// causal rows (whose cost grows with the query index), every units-th row.
struct BlockRows {
  int64_t first, end, step;
  C10_DEVICE BlockRows(int64_t rows, int cluster, bool strided) {
    const int64_t unit = blockIdx.x / cluster, units = gridDim.x / cluster;
    if (strided) {
      first = unit, end = rows, step = units;
    } else {
      first = unit * rows / units, end = (unit + 1) * rows / units, step = 1;
    }
  }
};

// Bit k set: column col + k < kept (room = kept - col).
template <int kVec>
C10_DEVICE C10_ALWAYS_INLINE uint32_t range_bits(int64_t room) {
  constexpr uint32_t kAll = (1u << kVec) - 1u;
  return room >= kVec ? kAll : room <= 0 ? 0u : (1u << room) - 1u;
}

// A vector of kVec elements of T as loaded: 32-bit words, each element converted to float where it
// is used. nvcc keeps an AlignedVector<bf16, 8> as eight registers, one per element (it splits the
// struct for the element accesses); as words it takes four, the loaded registers themselves.
template <class T, int kVec>
struct Packed {
  static constexpr int kWords = static_cast<int>((kVec * sizeof(T) + 3) / 4);
  uint32_t w[kWords];

  static C10_DEVICE C10_ALWAYS_INLINE Packed zero() {
    Packed p;
#pragma unroll
    for (int i = 0; i < kWords; ++i) p.w[i] = 0;
    return p;
  }
  static C10_DEVICE C10_ALWAYS_INLINE Packed load(const T* base, int64_t offset) {
    Packed p;
    if constexpr (kVec * sizeof(T) % 4 == 0) {
      const auto v = load_vector<kWords>(reinterpret_cast<const uint32_t*>(base + offset), 0);
#pragma unroll
      for (int i = 0; i < kWords; ++i) p.w[i] = v.value[i];
    } else {
      static_assert(kVec == 1 && sizeof(T) == 2, "one 16-bit element");
      p.w[0] = *reinterpret_cast<const uint16_t*>(base + offset);
    }
    return p;
  }
  // Element k as float.
  C10_DEVICE C10_ALWAYS_INLINE float operator[](int k) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w[k]);
    } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
      return __uint_as_float(k % 2 == 1 ? w[k / 2] & 0xffff0000u : w[k / 2] << 16);
    } else {
      const auto bits = static_cast<uint16_t>(w[k / 2] >> (16 * (k % 2)));
      return static_cast<float>(T(bits, T::from_bits()));
    }
  }
};

// Hides a vector's words from the optimizer: what a later pass computes from them (the elements as
// float, their exponentials) is recomputed there instead of kept in registers since an earlier pass.
// Without it ptxas keeps them (common subexpressions): bf16 data then takes twice its registers,
// and the warp and row kernels spilled or dropped to 2-3 blocks per SM. An empty asm does not stop
// ptxas (it never sees one); an identity byte permute (one PRMT per word and pass) does. No-op on ROCm.
template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void launder(Packed<T, kVec>& v) {
#if !defined(USE_ROCM)
#pragma unroll
  for (int i = 0; i < Packed<T, kVec>::kWords; ++i) asm volatile("prmt.b32 %0, %0, 0, 0x3210;" : "+r"(v.w[i]));
#endif
}

// The mask bytes of a vector (kVec columns) as loaded: one byte per column, in 32-bit words.
template <int kVec>
struct MaskBytes {
  static constexpr int kWords = (kVec + 3) / 4;
  uint32_t w[kWords];

  static C10_DEVICE C10_ALWAYS_INLINE MaskBytes zero() {
    MaskBytes m;
#pragma unroll
    for (int i = 0; i < kWords; ++i) m.w[i] = 0;
    return m;
  }
  // `row` and `col` kVec-aligned (forward() checks the mask's pointer and strides).
  static C10_DEVICE C10_ALWAYS_INLINE MaskBytes load(const uint8_t* row, int64_t col) {
    MaskBytes m;
    if constexpr (kVec % 4 == 0) {
      const auto v = load_vector<kWords>(reinterpret_cast<const uint32_t*>(row + col), 0);
#pragma unroll
      for (int i = 0; i < kWords; ++i) m.w[i] = v.value[i];
    } else {
      uint32_t bytes = 0;
#pragma unroll
      for (int k = 0; k < kVec; ++k) bytes |= static_cast<uint32_t>(row[col + k]) << (8 * k);
      m.w[0] = bytes;
    }
    return m;
  }
  // Bit k set: byte k is nonzero (column col + k masked). Four bytes at a time: bit 7 of each byte
  // of ((w & 0x7f..) + 0x7f..) | w is set iff the byte is nonzero; shifted down to 0/1 bytes b0..b3,
  // a multiply by 0x01020408 sums b0 + 2 b1 + 4 b2 + 8 b3 into the top byte (no carries: each byte
  // sum is at most 15). Six instructions per four columns, once per mask row a lane or thread loads.
  C10_DEVICE C10_ALWAYS_INLINE uint32_t bits() const {
    uint32_t out = 0;
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const uint32_t high = (((w[i] & 0x7f7f7f7fu) + 0x7f7f7f7fu) | w[i]) & 0x80808080u;
      out |= (((high >> 7) * 0x01020408u) >> 24) << (4 * i);
    }
    return kVec >= 4 ? out : out & ((1u << kVec) - 1u);
  }
};

struct Max {
  C10_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }  // NaN-ignoring: NaN reaches the sum
};
struct Sum {
  C10_DEVICE float operator()(float a, float b) const { return a + b; }
};

// Softmax statistics, in the exp2 domain: max of v = x * scale * log2(e), sum of exp2(v - max).
struct Stats {
  float max;
  float sum;
  static C10_DEVICE Stats empty() { return {kNegInf, 0.0f}; }
  // Folds in kVec values whose largest is `group_max`; -inf values (masked) add nothing.
  template <int kVec>
  C10_DEVICE void absorb(const float (&v)[kVec], float group_max) {
    if (group_max > max) {
      sum *= exp2f(max - group_max);
      max = group_max;
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum += v[k] == kNegInf ? 0.0f : exp2f(v[k] - max);
  }
};

// The subtrahend of exp2(v - base): the row's max, or 0 for a row whose max is -inf (nothing kept,
// or only -inf scores), so that its -inf values give exp2(-inf) = 0, not NaN.
C10_DEVICE C10_ALWAYS_INLINE float exp_base(float max) { return max == kNegInf ? 0.0f : max; }

// Branch-free: a side whose max is -inf (nothing kept: its sum is 0, or NaN, which stays NaN) is
// rescaled by exp2(-inf) = 0. fast_exp2's flush of factors below 2^-126 drops nothing the other
// side's sum (at least the 1 of its max) could show.
struct MergeStats {
  C10_DEVICE Stats operator()(const Stats& a, const Stats& b) const {
    const float m = fmaxf(a.max, b.max), base = exp_base(m);
    return {m, a.sum * fast_exp2(a.max - base) + b.sum * fast_exp2(b.max - base)};
  }
};

// 1 / sum, or 0 for a row with nothing kept (all of it masked): its output is zeros.
C10_DEVICE C10_ALWAYS_INLINE float inverse_sum(float sum) { return sum == 0.0f ? 0.0f : 1.0f / sum; }

// This block's rank in its cluster (0 without one).
C10_DEVICE C10_ALWAYS_INLINE int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)
  return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#else
  return 0;
#endif
}

// combine() of every block's `value` over the cluster (each block's is the same in all its
// threads); every thread of every block gets the same result (all fold in rank order).
template <class V, class Combine>
C10_DEVICE V cluster_all_reduce(V value, Combine combine, const V& identity, int cluster, V* slot) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)
  if (cluster > 1) {
    cooperative_groups::cluster_group group = cooperative_groups::this_cluster();
    if (threadIdx.x == 0) *slot = value;
    group.sync();
    V total = identity;
    for (int r = 0; r < cluster; ++r) total = combine(total, *group.map_shared_rank(slot, r));
    group.sync();  // every block has read every slot before any is written again (next row) or freed
    return total;
  }
#endif
  return value;
}

// ---- the row kernel's reductions ---------------------------------------------------------------

// Warps a row-kernel block has at most.
constexpr int kMaxRowWarps = kMaxRowThreads / C10_WARP_SIZE;

// combine() of `value` over the block, every thread getting it, with one barrier: each warp's
// partial goes to scratch[parity], and every warp folds all of them. Consecutive calls alternate
// `parity` (the row count's low bit): a call's writes come after the previous call's barrier, which
// every reader of the slots written two calls earlier has passed.
template <class V, class Combine>
C10_DEVICE V block_all_reduce_once(V value, Combine combine, const V& identity, V (*scratch)[kMaxRowWarps],
                                   int parity) {
  value = cuda::warp_reduce(value, combine);
  const int warps = blockDim.x / C10_WARP_SIZE;
  if (warps == 1) return value;
  const int lane = threadIdx.x % C10_WARP_SIZE, warp = threadIdx.x / C10_WARP_SIZE;
  if (lane == 0) scratch[parity][warp] = value;
  __syncthreads();
  return cuda::warp_reduce(lane < warps ? scratch[parity][lane] : identity, combine);
}

// The blocks of a row-kernel cluster exchange their statistics by asynchronous stores into each
// other's shared memory (st.async), each completing its bytes on the receiver's mbarrier: a block
// waits only for the values it needs, and no cluster barrier (with its release fence, which waits
// for the block's outstanding stores and the next row's loads) stands in each row. Two sets of
// slots and barriers, alternating by row: a block sends row n + 2's value into a set only after it
// has received everyone's row n + 1 value, which each block sends after it has read row n's.
template <class V>
struct ClusterExchange {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8, "st.async moves 4 or 8 bytes here");
  static constexpr int kWords = sizeof(V) / 4;
  uint64_t barrier[2];
  alignas(8) uint32_t slot[2][kMaxCluster][kWords];
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)
C10_DEVICE C10_ALWAYS_INLINE uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The shared::cluster address of `local`'s copy in block `rank` of the cluster.
C10_DEVICE C10_ALWAYS_INLINE uint32_t cluster_address(const void* local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(local)), "r"(rank));
  return remote;
}
#endif

// Once per kernel, by every thread of every block, before the first exchange: the barriers exist
// (in every block of the cluster) before anyone sends.
template <class V>
C10_DEVICE void exchange_init(ClusterExchange<V>& e) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&e.barrier[0])) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&e.barrier[1])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cooperative_groups::this_cluster().sync();
#endif
}

// Once per kernel, after the last exchange: no block leaves while another may still write to it.
C10_DEVICE C10_ALWAYS_INLINE void exchange_finish() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)
  cooperative_groups::this_cluster().sync();
#endif
}

// combine() over the cluster of each block's `value` (that of thread r goes to block r), for the
// block's n-th row; every thread gets the blocks' values folded in rank order.
template <class V, class Combine>
C10_DEVICE V exchange(ClusterExchange<V>& e, V value, Combine combine, const V& identity, int cluster, uint32_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)
  constexpr int kWords = ClusterExchange<V>::kWords;
  const int set = static_cast<int>(n & 1u);
  const uint32_t phase = (n >> 1) & 1u;  // the set's uses alternate its barrier's phase
  const uint32_t barrier = shared_address(&e.barrier[set]);
  if (threadIdx.x == 0) {
    asm volatile("{ .reg .b64 state; mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1; }" ::"r"(barrier),
                 "r"(static_cast<uint32_t>(cluster * sizeof(V)))
                 : "memory");
  }
  if (static_cast<int>(threadIdx.x) < cluster) {
    const int to = static_cast<int>(threadIdx.x);
    uint32_t words[kWords];
    memcpy(words, &value, sizeof(V));
    const uint32_t slot = cluster_address(&e.slot[set][cluster_rank()][0], to);
    const uint32_t remote_barrier = cluster_address(&e.barrier[set], to);
    if constexpr (kWords == 1) {
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(slot),
                   "r"(words[0]), "r"(remote_barrier)
                   : "memory");
    } else {
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(slot),
                   "r"(words[0]), "r"(words[1]), "r"(remote_barrier)
                   : "memory");
    }
  }
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(barrier), "r"(phase)
        : "memory");
  }
  V total = identity;
  for (int r = 0; r < cluster; ++r) {
    V v;
    memcpy(&v, &e.slot[set][r][0], sizeof(V));
    total = combine(total, v);
  }
  return total;
#else
  return value;
#endif
}

// The forward for element type T (softmax_forward.cuh), instantiated once per dtype, each in a unit
// of its own (softmax_forward_<dtype>.cu); forward() dispatches to it (softmax_forward_float32.cu).
template <class T>
void forward_as(const Cuda& device, const ForwardArgs& args);

}  // namespace apex::fused_softmax
