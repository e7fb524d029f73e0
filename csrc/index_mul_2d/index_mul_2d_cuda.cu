// index_mul_2d: CUDA kernels. A 2-D grid (apex/row_grid.cuh) walks [rows, features] in 16-byte
// packs; each row reads its index once, gathers the in1 (or grad_grad_in1) pack it needs, and the
// backward passes add into the float accumulator of grad_in1 with vector atomics where the GPU has
// them (sm_90+: one float4 atomic per 4 values).
#include <limits>

#include "apex/cuda.cuh"
#include "apex/row_grid.cuh"
#include "apex/acc_type.h"
#include "index_mul_2d.h"

namespace apex::index_mul_2d {
namespace {

template <class Acc, int kVec>
using Values = AlignedVector<Acc, kVec>;

// kVec values of T at offset, as Acc; zeros for a null tensor (an unused double-backward input).
template <class Acc, int kVec, class T>
C10_DEVICE Values<Acc, kVec> load(const T* base, int64_t offset) {
  Values<Acc, kVec> out;
  if (base == nullptr) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.value[k] = Acc(0);
    return out;
  }
  const AlignedVector<T, kVec> pack = load_vector<kVec>(base, offset);
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.value[k] = static_cast<Acc>(pack.value[k]);
  return out;
}

template <int kVec, class T, class Acc>
C10_DEVICE void store(T* base, int64_t offset, const Values<Acc, kVec>& values) {
  AlignedVector<T, kVec> pack;
#pragma unroll
  for (int k = 0; k < kVec; ++k) pack.value[k] = static_cast<T>(values.value[k]);
  store_vector<kVec>(base, offset, pack);
}

template <class Acc, int kVec>
C10_DEVICE Values<Acc, kVec> nan_values() {
  Values<Acc, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.value[k] = std::numeric_limits<Acc>::quiet_NaN();
  return out;
}

// a * b + c * d, element-wise.
template <class Acc, int kVec>
C10_DEVICE Values<Acc, kVec> mul_add(const Values<Acc, kVec>& a, const Values<Acc, kVec>& b,
                                     const Values<Acc, kVec>& c, const Values<Acc, kVec>& d) {
  Values<Acc, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.value[k] = a.value[k] * b.value[k] + c.value[k] * d.value[k];
  return out;
}

template <class Acc, int kVec>
C10_DEVICE Values<Acc, kVec> mul(const Values<Acc, kVec>& a, const Values<Acc, kVec>& b) {
  Values<Acc, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.value[k] = a.value[k] * b.value[k];
  return out;
}

// accumulator[offset + k] += values[k], atomically (rows of grad_in1 are shared by every row
// gathering them).
template <class Acc, int kVec>
C10_DEVICE void scatter_add(Acc* accumulator, int64_t offset, const Values<Acc, kVec>& values) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(USE_ROCM)
  if constexpr (std::is_same_v<Acc, float> && kVec % 4 == 0) {
#pragma unroll
    for (int k = 0; k < kVec; k += 4) {
      atomicAdd(reinterpret_cast<float4*>(accumulator + offset + k),
                make_float4(values.value[k], values.value[k + 1], values.value[k + 2], values.value[k + 3]));
    }
    return;
  }
#endif
#pragma unroll
  for (int k = 0; k < kVec; ++k) atomicAdd(accumulator + offset + k, values.value[k]);
}

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

template <class T, int kVec, Pass kPass>
__global__ void __launch_bounds__(kThreads) index_mul_kernel(Args args) {
  using Acc = acc_type<T>;
  const T* in1 = static_cast<const T*>(args.in1);
  const T* in2 = static_cast<const T*>(args.in2);
  const T* grad_out = static_cast<const T*>(args.grad_out);
  const T* gg1 = static_cast<const T*>(args.grad_grad_in1);
  const T* gg2 = static_cast<const T*>(args.grad_grad_in2);
  T* out = static_cast<T*>(args.out);
  T* out2 = static_cast<T*>(args.out2);
  Acc* grad_in1 = static_cast<Acc*>(args.grad_in1);
  const int64_t features = args.features, packs = features / kVec;
  cuda::for_each_row(args.rows, [&](int64_t row) {
    int64_t source = args.index[row];
    if (source < 0) source += args.sources;
    const bool valid = source >= 0 && source < args.sources;
    cuda::for_each_pack(packs, [&](int64_t pack) {
      const int64_t at_row = row * features + pack * kVec, at_source = source * features + pack * kVec;
      if constexpr (kPass == Pass::kForward) {
        const auto result = valid ? mul(load<Acc, kVec>(in1, at_source), load<Acc, kVec>(in2, at_row))
                                  : nan_values<Acc, kVec>();
        store<kVec>(out, at_row, result);
      } else if constexpr (kPass == Pass::kBackward) {
        const auto g = load<Acc, kVec>(grad_out, at_row);
        if (!valid) {
          store<kVec>(out, at_row, nan_values<Acc, kVec>());
          return;
        }
        store<kVec>(out, at_row, mul(g, load<Acc, kVec>(in1, at_source)));
        scatter_add(grad_in1, at_source, mul(g, load<Acc, kVec>(in2, at_row)));
      } else {
        if (!valid) {
          store<kVec>(out, at_row, nan_values<Acc, kVec>());
          store<kVec>(out2, at_row, nan_values<Acc, kVec>());
          return;
        }
        const auto g = load<Acc, kVec>(grad_out, at_row);
        const auto g1 = load<Acc, kVec>(gg1, at_source);
        const auto g2 = load<Acc, kVec>(gg2, at_row);
        store<kVec>(out, at_row, mul_add(g1, load<Acc, kVec>(in2, at_row), load<Acc, kVec>(in1, at_source), g2));
        store<kVec>(out2, at_row, mul(g1, g));
        if (gg2 != nullptr) scatter_add(grad_in1, at_source, mul(g2, g));
      }
    });
  });
}

template <class T, int kVec>
void launch(const Cuda& device, Pass pass, const Args& args) {
  const cuda::RowGrid grid = cuda::row_grid(args.rows, args.features / kVec, device, kThreads, kBlocksPerSm);
  const cudaStream_t stream = cuda::stream(device);
  switch (pass) {
    case Pass::kForward: index_mul_kernel<T, kVec, Pass::kForward><<<grid.grid, grid.block, 0, stream>>>(args); break;
    case Pass::kBackward: index_mul_kernel<T, kVec, Pass::kBackward><<<grid.grid, grid.block, 0, stream>>>(args); break;
    case Pass::kDoubleBackward:
      index_mul_kernel<T, kVec, Pass::kDoubleBackward><<<grid.grid, grid.block, 0, stream>>>(args);
      break;
  }
}

}  // namespace

void index_mul(const Cuda& device, Pass pass, const Args& args) {
  if (args.rows == 0 || args.features == 0) return;
  dispatch_floating(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vector_width<T>();
    // 16-byte packs need rows that start on 16-byte boundaries in every tensor.
    bool aligned = args.features % kVec == 0;
    for (const void* p : {args.in1, args.in2, args.grad_out, args.grad_grad_in1, args.grad_grad_in2,
                          static_cast<const void*>(args.out), static_cast<const void*>(args.out2),
                          static_cast<const void*>(args.grad_in1)}) {
      aligned = aligned && (p == nullptr || is_aligned(p));
    }
    if (aligned) {
      launch<T, kVec>(device, pass, args);
    } else {
      launch<T, 1>(device, pass, args);
    }
  });
  cuda::check_launch("index_mul_2d");
}

}  // namespace apex::index_mul_2d
