#pragma once
// fused_softmax: what the forward and backward CUDA kernels share.
//
// Two kernel shapes, picked per call by plan_rows():
//  - warp kernel: `group` lanes (a power of two up to a warp) per row, the row in registers, up to
//    8 (forward) or 4 (backward) 16-byte vectors per lane. Reductions are lane shuffles; several
//    rows per warp when a row is short.
//  - block kernel: one block per row, or on Hopper (sm_90) a thread-block cluster of up to
//    kMaxCluster blocks, each taking one chunk of the row. Each thread stages what it loads in
//    shared memory during the first pass (the row's statistics), so the second pass (the output)
//    reads shared memory, not HBM: every element is read once and written once, for any row
//    length that fits the cluster's shared memory (bf16: 65536+ columns forward and backward).
//    The blocks of a cluster combine their statistics through distributed shared memory. Rows
//    longer than that (or longer than one block's shared memory before Hopper) take the same
//    kernel unstaged: the second pass reads the row from global memory again.
// Values are float in registers; exp(x) is computed as exp2(x * log2(e)) (one FFMA, one MUFU.EX2).
#include <cmath>
#include <cstdint>

#if !defined(USE_ROCM)
#include <cooperative_groups.h>
#endif

#include "apex/block_reduce.cuh"
#include "apex/cuda.cuh"
#include "apex/occupancy.cuh"
#include "fused_softmax.h"

namespace apex::fused_softmax {

// Warp kernel blocks: 4 warps (as many rows as fit), so small grids still fill every SM. The
// forward keeps 4 of them resident per SM (up to 128 registers: 8 vectors of floats per lane, all
// loads in flight at once); the backward holds two tensors' vectors and is left its registers
// (bf16: 98, 5 blocks per SM; capped at 64 it spilled).
constexpr int kWarpKernelThreads = 128;
constexpr int kMinWarpBlocksPerSm = 4;
// 16-byte vectors a lane of the warp kernel holds per tensor: forward 8 (2048 bf16/fp16 or 1024
// fp32 columns per row), backward 4 (with 8 the bf16 backward needed 174 registers, 8 warps per SM:
// longer rows go to the block kernel, which keeps its occupancy).
constexpr int kMaxForwardPacks = 8;
constexpr int kMaxBackwardPacks = 4;
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
// blocks that fit: each row costs the cluster two cluster-wide barriers). bf16 rows of 32K
// columns stay in one block; 64K take 2 (forward) or 4 (backward).
constexpr int64_t kStageBudgetBytes = 96 * 1024;
// Largest portable thread-block cluster.
constexpr int kMaxCluster = 8;
// Shared memory the block kernels declare themselves (reduction scratch: 16 warps' 8-byte partials
// and two slots, 144 bytes), which a staged chunk leaves free of a block's opt-in maximum.
constexpr int64_t kStaticSharedBytes = 256;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -INFINITY;

// ---- how a call spreads its rows (host) --------------------------------------------------------

struct Plan {
  bool warp;       // the warp kernel (else the block kernel)
  int vec;         // elements per vector: vector_width<T>() or 1 (unaligned data)
  int packs;       // warp kernel: vectors per lane (a power of two up to max_packs)
  int group;       // warp kernel: lanes per row
  int threads;     // block kernel: threads per block
  int cluster;     // block kernel: blocks per row (1: no cluster)
  int64_t chunk;   // block kernel: columns per block (a multiple of vec)
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

// `stage_bytes_per_column`: shared memory a staged column takes (forward: the element plus its bit
// of the keep mask; backward: two elements). `allows_clusters()`: supports_clusters() of the block
// kernel, asked only when the block kernel is picked.
template <class ClusterCheck>
Plan plan_rows(int64_t cols, int vec, int max_packs, double stage_bytes_per_column, const Cuda& device,
               ClusterCheck&& allows_clusters) {
  Plan plan{};
  plan.vec = vec;
  const int64_t vectors = ceil_div(cols, vec);
  if (vectors <= int64_t{C10_WARP_SIZE} * max_packs) {
    plan.warp = true;
    plan.packs = vectors <= C10_WARP_SIZE ? 1 : pow2_at_least(ceil_div(vectors, C10_WARP_SIZE));
    plan.group = plan.packs == 1 ? pow2_at_least(vectors) : C10_WARP_SIZE;
    return plan;
  }
  const DeviceInfo info = device_info(device.device);
  const bool clusters = allows_clusters();
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
  return plan;
}

// Launches kernel<<<blocks, plan.threads, plan.smem>>>(args..., plan) with plan.cluster blocks per
// cluster; blocks = one per row up to what is resident at once (the kernel loops over rows).
template <class Kernel, class... Args>
void launch_block_kernel(Kernel kernel, const Plan& plan, int64_t rows, const Cuda& device, const char* op,
                         const Args&... args) {
  // Also opts the kernel in to more than the default 48 KB of dynamic shared memory where plan.smem needs it.
  const int resident =
      cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), plan.threads, plan.smem, device.device);
  const int64_t most = std::max<int64_t>(1, static_cast<int64_t>(cuda::sm_count(device.device)) * resident / plan.cluster);
  const int64_t blocks = std::max<int64_t>(1, std::min(rows, most)) * plan.cluster;
  const cudaStream_t stream = cuda::stream(device);
  if (plan.cluster == 1) {
    kernel<<<static_cast<unsigned>(blocks), plan.threads, plan.smem, stream>>>(args..., plan);
  } else {
#if !defined(USE_ROCM)
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(plan.threads);
    config.dynamicSmemBytes = plan.smem;
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

// Launches the warp kernel instance for plan.packs: kernels[k] is the one for 2^k vectors per lane.
template <class Args, size_t kInstances>
void launch_warp_kernel(void (*const (&kernels)[kInstances])(Args, int), const Plan& plan, const Args& args,
                        const Cuda& device, const char* op) {
  size_t index = 0;
  while ((1 << index) < plan.packs && index + 1 < kInstances) ++index;
  const auto kernel = kernels[index];
  const int64_t rows_per_block = kWarpKernelThreads / C10_WARP_SIZE * (C10_WARP_SIZE / plan.group);
  const int resident =
      cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kWarpKernelThreads, 0, device.device);
  const unsigned blocks = cuda::grid_size(args.rows, rows_per_block, resident, device);
  kernel<<<blocks, kWarpKernelThreads, 0, cuda::stream(device)>>>(args, plan.group);
  cuda::check_launch(op);
}

// Runs a forward or backward over args.rows rows of args.cols: the warp kernel instance for the
// plan's vectors per lane (warp_kernels[k]: 2^k), or the block kernel. `stage_bytes_per_column`: see
// plan_rows.
template <class Args, class BlockKernel, size_t kInstances>
void run_rows(const Args& args, const Cuda& device, int vec, double stage_bytes_per_column, BlockKernel block_kernel,
              void (*const (&warp_kernels)[kInstances])(Args, int), const char* op) {
  const Plan plan = plan_rows(args.cols, vec, 1 << (kInstances - 1), stage_bytes_per_column, device,
                              [&] { return supports_clusters(block_kernel, device); });
  if (plan.warp) {
    launch_warp_kernel(warp_kernels, plan, args, device, op);
  } else {
    launch_block_kernel(block_kernel, plan, args.rows, device, op, args);
  }
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

// How a warp kernel's lanes share rows: `group` neighbouring lanes per row, the warp's rows
// consecutive, warps striding over the rows. Every lane runs every iteration (the shuffles need
// the whole warp): `first` is the warp's first row, first + row_in_warp this lane's (idle when
// past the last row).
struct WarpRows {
  int member;          // this lane's index in its group
  int row_in_warp;     // this lane's group in the warp
  int64_t first;       // the warp's first row of the first iteration
  int64_t step;        // rows between iterations
  C10_DEVICE explicit WarpRows(int group) {
    const int lane = threadIdx.x % C10_WARP_SIZE;
    const int rows_per_warp = C10_WARP_SIZE / group;
    member = lane % group;
    row_in_warp = lane / group;
    first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / C10_WARP_SIZE * rows_per_warp;
    step = static_cast<int64_t>(gridDim.x) * blockDim.x / C10_WARP_SIZE * rows_per_warp;
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

struct MergeStats {
  C10_DEVICE Stats operator()(const Stats& a, const Stats& b) const {
    const float m = fmaxf(a.max, b.max);
    if (m == kNegInf) return {m, a.sum + b.sum};  // nothing kept yet (a NaN sum stays NaN)
    return {m, a.sum * exp2f(a.max - m) + b.sum * exp2f(b.max - m)};
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

}  // namespace apex::fused_softmax
