// syncbn CUDA element-wise kernels: normalize (+ residual, + relu), the fused
// relu's backward mask and the input gradient; and the CUDA registration of
// every syncbn op.
//
// The tensor is walked as a 2-D array [lines][line_length] with 16-byte loads
// along lines: NCHW lines are planes (one channel each), channels-last lines are
// rows (channel = position in the row). Neither needs a division per element.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "cuda_utils.cuh"

namespace apex_syncbn {
namespace {

constexpr int kThreads = 256;
// Caps the grid; threads loop over the remaining lines.
constexpr int kBlocksPerSMCap = 16;

template <typename acc_t>
struct ChannelAffine {
  const acc_t* mean;
  const acc_t* inv_std;
  const acc_t* weight;  // may be null: 1
  const acc_t* shift;   // may be null: 0

  __device__ acc_t operator()(acc_t x, int64_t c) const {
    const acc_t scale = weight ? inv_std[c] * weight[c] : inv_std[c];
    return (x - mean[c]) * scale + (shift ? shift[c] : acc_t(0));
  }
};

// Operands: (x, z). z is 0 when absent.
template <typename acc_t>
struct NormalizeOp {
  ChannelAffine<acc_t> affine;
  bool fuse_relu;
  __device__ void prepare() {}
  __device__ acc_t operator()(acc_t x, acc_t z, acc_t, int64_t c) const {
    const acc_t y = affine(x, c) + z;
    return fuse_relu && y < acc_t(0) ? acc_t(0) : y;
  }
};

// Operands: (dy, x, z). Recomputes the pre-relu output instead of storing it.
template <typename acc_t>
struct ReluMaskOp {
  ChannelAffine<acc_t> affine;
  __device__ void prepare() {}
  __device__ acc_t operator()(acc_t dy, acc_t x, acc_t z, int64_t c) const {
    return affine(x, c) + z > acc_t(0) ? dy : acc_t(0);
  }
};

// Operands: (dy, x). dx = (dy - mean(dy) - (x - mean) * inv_std^2 * mean(dy * (x - mean))) * inv_std * weight.
template <typename acc_t>
struct InputGradOp {
  const acc_t* mean;
  const acc_t* inv_std;
  const acc_t* weight;  // may be null: 1
  const acc_t* sum_dy;
  const acc_t* sum_dy_xmu;
  const int64_t* count;  // elements per channel on each rank
  int64_t world;
  acc_t inv_total;

  // The global element count lives on the device; summing it per thread avoids a sync.
  __device__ void prepare() {
    int64_t total = 0;
    for (int64_t r = 0; r < world; ++r) total += count[r];
    inv_total = acc_t(1) / acc_t(total);
  }
  __device__ acc_t operator()(acc_t dy, acc_t x, acc_t, int64_t c) const {
    const acc_t sigma_inv = inv_std[c];
    const acc_t mean_dy = sum_dy[c] * inv_total;
    const acc_t xmu_factor = sigma_inv * sigma_inv * sum_dy_xmu[c] * inv_total;
    const acc_t scale = weight ? sigma_inv * weight[c] : sigma_inv;
    return (dy - mean_dy - (x - mean[c]) * xmu_factor) * scale;
  }
};

template <int VEC, typename scalar_t>
__device__ __forceinline__ Pack<scalar_t, VEC> load_or_zero(const scalar_t* base, int64_t offset) {
  if (base) return load_pack<VEC>(base, offset);
  Pack<scalar_t, VEC> zeros;
#pragma unroll
  for (int v = 0; v < VEC; ++v) zeros.value[v] = scalar_t(0);
  return zeros;
}

// out = op(a, b, c, channel) element-wise; b and c may be null (read as 0).
// Threads form [rows][columns] per block: columns walk a line, rows walk lines.
template <int VEC, typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreads)
    channel_elementwise_kernel(Op op, const scalar_t* a, const scalar_t* b, const scalar_t* c, scalar_t* out,
                               Layout layout, int columns) {
  using acc_t = at::opmath_type<scalar_t>;
  op.prepare();
  const bool nchw = !layout.channels_last();
  const int64_t lines = nchw ? layout.outer * layout.channels : layout.outer;
  const int64_t line_length = nchw ? layout.inner : layout.channels;
  const int column = threadIdx.x % columns, rows = kThreads / columns;
  for (int64_t line = int64_t(blockIdx.y) * rows + threadIdx.x / columns; line < lines;
       line += int64_t(gridDim.y) * rows) {
    const int64_t line_channel = nchw ? line % layout.channels : 0;
    for (int64_t i = (int64_t(blockIdx.x) * columns + column) * VEC; i < line_length;
         i += int64_t(gridDim.x) * columns * VEC) {
      const int64_t offset = line * line_length + i;
      const auto pa = load_pack<VEC>(a, offset);
      const auto pb = load_or_zero<VEC>(b, offset);
      const auto pc = load_or_zero<VEC>(c, offset);
      Pack<scalar_t, VEC> result;
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        const int64_t channel = nchw ? line_channel : i + v;
        result.value[v] = scalar_t(op(acc_t(pa.value[v]), acc_t(pb.value[v]), acc_t(pc.value[v]), channel));
      }
      store_pack<VEC>(out, offset, result);
    }
  }
}

int next_power_of_two(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

template <typename scalar_t, typename Op>
void launch_channel_elementwise(const Op& op, const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out,
                                Layout layout) {
  constexpr int VEC = vector_width<scalar_t>();
  const bool nchw = !layout.channels_last();
  const int64_t lines = nchw ? layout.outer * layout.channels : layout.outer;
  const int64_t line_length = nchw ? layout.inner : layout.channels;
  const bool vectorized = line_length % VEC == 0 && is_vector_aligned(a) && is_vector_aligned(b) &&
                          is_vector_aligned(c) && is_vector_aligned(out);
  const int width = vectorized ? VEC : 1;
  const int columns = std::min(kThreads, next_power_of_two(ceil_div(line_length, width)));
  const int64_t max_blocks = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * kBlocksPerSMCap;
  const int64_t blocks_x = std::min(ceil_div(line_length, int64_t(columns) * width), max_blocks);
  const int64_t blocks_y = std::clamp<int64_t>(max_blocks / blocks_x, 1, ceil_div(lines, kThreads / columns));
  const dim3 grid(blocks_x, std::min<int64_t>(blocks_y, 65535));
  auto ptr = [](const Tensor& t) { return t.defined() ? t.const_data_ptr<scalar_t>() : nullptr; };
  const auto stream = at::cuda::getCurrentCUDAStream();
  scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
  if (vectorized) {
    channel_elementwise_kernel<VEC><<<grid, kThreads, 0, stream>>>(op, ptr(a), ptr(b), ptr(c), out_ptr, layout, columns);
  } else {
    channel_elementwise_kernel<1><<<grid, kThreads, 0, stream>>>(op, ptr(a), ptr(b), ptr(c), out_ptr, layout, columns);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename acc_t>
const acc_t* data_or_null(const Tensor& t) {
  return t.defined() ? t.const_data_ptr<acc_t>() : nullptr;
}

template <typename acc_t>
ChannelAffine<acc_t> channel_affine(const Tensor& mean, const Tensor& inv_std, const Tensor& weight,
                                    const Tensor& shift) {
  return {mean.const_data_ptr<acc_t>(), inv_std.const_data_ptr<acc_t>(), data_or_null<acc_t>(weight),
          data_or_null<acc_t>(shift)};
}

}  // namespace

void CudaKernels::batchnorm_forward(const Tensor& input, const Tensor& z, const Tensor& mean, const Tensor& inv_std,
                                    const Tensor& weight, const Tensor& shift, bool fuse_relu, Layout layout,
                                    Tensor& out) {
  const c10::cuda::CUDAGuard guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "syncbn_batchnorm_forward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const NormalizeOp<acc_t> op{channel_affine<acc_t>(mean, inv_std, weight, shift), fuse_relu};
    launch_channel_elementwise<scalar_t>(op, input, z, Tensor(), out, layout);
  });
}

void CudaKernels::relu_backward(const Tensor& grad_output, const Tensor& input, const Tensor& z, const Tensor& mean,
                                const Tensor& inv_std, const Tensor& weight, const Tensor& shift, Layout layout,
                                Tensor& out) {
  const c10::cuda::CUDAGuard guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "syncbn_relu_bw_c_last_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const ReluMaskOp<acc_t> op{channel_affine<acc_t>(mean, inv_std, weight, shift)};
    launch_channel_elementwise<scalar_t>(op, grad_output, input, z, out, layout);
  });
}

void CudaKernels::batchnorm_backward(const Tensor& grad_output, const Tensor& input, const Tensor& mean,
                                     const Tensor& inv_std, const Tensor& weight, const Tensor& sum_dy,
                                     const Tensor& sum_dy_xmu, const Tensor& count, Layout layout,
                                     Tensor& grad_input) {
  const c10::cuda::CUDAGuard guard(input.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "syncbn_batchnorm_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const InputGradOp<acc_t> op{mean.const_data_ptr<acc_t>(),   inv_std.const_data_ptr<acc_t>(),
                                data_or_null<acc_t>(weight),    sum_dy.const_data_ptr<acc_t>(),
                                sum_dy_xmu.const_data_ptr<acc_t>(), count.const_data_ptr<int64_t>(),
                                count.numel(),                  acc_t(0)};
    launch_channel_elementwise<scalar_t>(op, grad_output, input, Tensor(), grad_input, layout);
  });
}

}  // namespace apex_syncbn

TORCH_LIBRARY_IMPL(apex, CUDA, m) {
  APEX_SYNCBN_REGISTER_KERNELS(m, ::apex_syncbn::CudaKernels);
}
