// focal_loss: CUDA kernels over a 2-D [rows, packs] grid (apex/row_grid.cuh). The forward reads the
// logits once and writes one partial sum per block, which a one-block kernel adds up in a fixed
// order (the same loss every run); the backward reads the logits once more and writes the gradient
// (no partial gradient is stored between them).
#include "apex/block_reduce.cuh"
#include "apex/cuda.cuh"
#include "apex/row_grid.cuh"
#include "apex/acc_type.h"
#include "focal_loss.h"
#include "focal_loss_math.h"

namespace apex::focal_loss {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

template <class Acc>
struct Add {
  C10_DEVICE Acc operator()(Acc a, Acc b) const { return a + b; }
};

// Calls pack(values, offset, first_class, label) for every kVec-wide pack of logits of every
// non-ignored row this thread owns; ignored rows go to ignored(row) instead, unread.
template <class T, int kVec, class Pack, class Ignored>
C10_DEVICE void for_each_pack_of_rows(const Problem& p, Pack&& pack_fn, Ignored&& ignored) {
  const T* logits = static_cast<const T*>(p.logits);
  const int64_t packs = p.classes / kVec;
  cuda::for_each_row(p.rows, [&](int64_t row) {
    const int64_t label = p.labels[row];
    if (label == kIgnored) {
      ignored(row);
      return;
    }
    cuda::for_each_pack(packs, [&](int64_t pack) {
      const int64_t offset = row * p.classes + pack * kVec;
      pack_fn(load_vector<kVec>(logits, offset), offset, pack * kVec, label);
    });
  });
}

template <class T, int kVec>
__global__ void __launch_bounds__(kThreads) forward_kernel(Problem p, acc_type<T>* partials) {
  using Acc = acc_type<T>;
  __shared__ Acc scratch[kThreads / C10_WARP_SIZE];
  Acc sum = 0;
  for_each_pack_of_rows<T, kVec>(
      p,
      [&](const AlignedVector<T, kVec>& values, int64_t, int64_t first, int64_t label) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          if (first + k < p.real_classes) {
            sum += focal_element<false, Acc>(static_cast<Acc>(values.value[k]), first + k == label, p.alpha, p.gamma,
                                             p.smoothing)
                       .loss;
          }
        }
      },
      [](int64_t) {});
  sum = cuda::block_reduce(sum, Add<Acc>{}, Acc(0), scratch);
  if (threadIdx.x == 0 && threadIdx.y == 0) partials[blockIdx.y * gridDim.x + blockIdx.x] = sum;
}

template <class Acc>
__global__ void __launch_bounds__(kThreads) finish_kernel(const Acc* partials, int count, const float* num_positives,
                                                          Acc* loss) {
  __shared__ Acc scratch[kThreads / C10_WARP_SIZE];
  Acc sum = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = cuda::block_reduce(sum, Add<Acc>{}, Acc(0), scratch);
  if (threadIdx.x == 0) *loss = sum / static_cast<Acc>(*num_positives);
}

template <class T, int kVec>
__global__ void __launch_bounds__(kThreads) backward_kernel(Problem p, const acc_type<T>* grad_loss, T* grad) {
  using Acc = acc_type<T>;
  const Acc scale = *grad_loss / static_cast<Acc>(*p.num_positives_sum);
  for_each_pack_of_rows<T, kVec>(
      p,
      [&](const AlignedVector<T, kVec>& values, int64_t offset, int64_t first, int64_t label) {
        AlignedVector<T, kVec> out;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const Acc g = first + k < p.real_classes
                            ? focal_element<true, Acc>(static_cast<Acc>(values.value[k]), first + k == label, p.alpha,
                                                       p.gamma, p.smoothing)
                                  .grad
                            : Acc(0);
          out.value[k] = static_cast<T>(scale * g);
        }
        store_vector<kVec>(grad, offset, out);
      },
      [&](int64_t row) {
        AlignedVector<T, kVec> zeros;
#pragma unroll
        for (int k = 0; k < kVec; ++k) zeros.value[k] = T(0);
        cuda::for_each_pack(p.classes / kVec,
                            [&](int64_t pack) { store_vector<kVec>(grad, row * p.classes + pack * kVec, zeros); });
      });
}

// Rows of 16-byte packs need a class count that keeps every row 16-byte aligned.
template <class T>
bool vectorizable(const Problem& p, const void* out) {
  return p.classes % vector_width<T>() == 0 && is_aligned(p.logits) && (out == nullptr || is_aligned(out));
}

template <class T, int kVec>
cuda::RowGrid grid_for(const Problem& p, const Cuda& device) {
  return cuda::row_grid(p.rows, p.classes / kVec, device, kThreads, kBlocksPerSm);
}

template <class T>
cuda::RowGrid grid_of(const Problem& p, const Cuda& device) {
  return vectorizable<T>(p, nullptr) ? grid_for<T, vector_width<T>()>(p, device) : grid_for<T, 1>(p, device);
}

}  // namespace

int64_t partials_size(const Cuda& device, const Problem& p) {
  return dispatch_floating(p.dtype, [&](auto tag) {
    const cuda::RowGrid grid = grid_of<typename decltype(tag)::type>(p, device);
    return static_cast<int64_t>(grid.grid.x) * grid.grid.y;
  });
}

void forward(const Cuda& device, const Problem& p, void* partials, void* loss) {
  dispatch_floating(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_type<T>;
    const cudaStream_t stream = cuda::stream(device);
    const cuda::RowGrid grid = grid_of<T>(p, device);
    Acc* sums = static_cast<Acc*>(partials);
    if (vectorizable<T>(p, nullptr)) {
      forward_kernel<T, vector_width<T>()><<<grid.grid, grid.block, 0, stream>>>(p, sums);
    } else {
      forward_kernel<T, 1><<<grid.grid, grid.block, 0, stream>>>(p, sums);
    }
    finish_kernel<Acc><<<1, kThreads, 0, stream>>>(sums, static_cast<int>(grid.grid.x * grid.grid.y),
                                                   p.num_positives_sum, static_cast<Acc*>(loss));
  });
  cuda::check_launch("focal_loss_forward");
}

void backward(const Cuda& device, const Problem& p, const void* grad_loss, void* grad) {
  if (p.rows == 0 || p.classes == 0) return;
  dispatch_floating(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = acc_type<T>;
    const cudaStream_t stream = cuda::stream(device);
    const Acc* g = static_cast<const Acc*>(grad_loss);
    if (vectorizable<T>(p, grad)) {
      constexpr int kVec = vector_width<T>();
      const cuda::RowGrid grid = grid_for<T, kVec>(p, device);
      backward_kernel<T, kVec><<<grid.grid, grid.block, 0, stream>>>(p, g, static_cast<T*>(grad));
    } else {
      const cuda::RowGrid grid = grid_for<T, 1>(p, device);
      backward_kernel<T, 1><<<grid.grid, grid.block, 0, stream>>>(p, g, static_cast<T*>(grad));
    }
  });
  cuda::check_launch("focal_loss_backward");
}

}  // namespace apex::focal_loss
