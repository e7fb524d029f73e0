// syncbn CUDA element-wise kernels: normalize (+ residual, + relu), the fused
// relu's backward mask and the input gradient.
//
// An op is written once, per channel: `channel(c)` gathers what channel c needs
// (statistics, affine parameters, gradient sums) into registers, and
// `op(channel, operands)` maps one element. Two kernels walk the layouts with
// 16-byte vectors and never divide per element:
//   NCHW: planes (one channel each) are lines; threads of a block split a line.
//   Channels-last: each thread owns VEC consecutive channels for all its rows, so
//     it gathers their constants once and a warp reads contiguous runs of a row.
#include <array>

#include "syncbn_cuda.cuh"

namespace apex::syncbn {
namespace {

constexpr int kThreads = 256;
// Caps the NCHW grid; threads loop over the remaining lines.
constexpr int kBlocksPerSMCap = 16;

template <typename acc_t>
struct ChannelAffine {
  acc_t mean, scale, shift;
  __device__ acc_t operator()(acc_t x) const { return (x - mean) * scale + shift; }
};

template <typename acc_t>
struct AffineParams {
  const acc_t* mean;
  const acc_t* inv_std;
  const acc_t* weight;  // may be null: 1
  const acc_t* shift;   // may be null: 0

  __device__ ChannelAffine<acc_t> channel(int64_t c) const {
    return {mean[c], weight ? inv_std[c] * weight[c] : inv_std[c], shift ? shift[c] : acc_t(0)};
  }
};

// Operands: (x, z). z is 0 when absent.
template <typename acc_t>
struct NormalizeOp {
  static constexpr int kOperands = 2;
  using Channel = ChannelAffine<acc_t>;
  AffineParams<acc_t> affine;
  bool fuse_relu;

  __device__ void prepare() {}
  __device__ Channel channel(int64_t c) const { return affine.channel(c); }
  __device__ acc_t operator()(const Channel& k, const acc_t (&in)[kOperands]) const {
    const acc_t y = k(in[0]) + in[1];
    return fuse_relu && y < acc_t(0) ? acc_t(0) : y;
  }
};

// Operands: (dy, x, z). Recomputes the pre-relu output instead of storing it.
template <typename acc_t>
struct ReluMaskOp {
  static constexpr int kOperands = 3;
  using Channel = ChannelAffine<acc_t>;
  AffineParams<acc_t> affine;

  __device__ void prepare() {}
  __device__ Channel channel(int64_t c) const { return affine.channel(c); }
  __device__ acc_t operator()(const Channel& k, const acc_t (&in)[kOperands]) const {
    return k(in[1]) + in[2] > acc_t(0) ? in[0] : acc_t(0);
  }
};

// Operands: (dy, x). dx = (dy - mean(dy) - (x - mean) * inv_std^2 * mean(dy * (x - mean))) * inv_std * weight.
template <typename acc_t>
struct InputGradOp {
  static constexpr int kOperands = 2;
  struct Channel {
    acc_t mean, mean_dy, xmu_factor, scale;
  };
  const acc_t* mean;
  const acc_t* inv_std;
  const acc_t* weight;  // may be null: 1
  const acc_t* sum_dy;      // both null: 0 (constant statistics)
  const acc_t* sum_dy_xmu;
  const int64_t* count;  // elements per channel on each rank, or null: `elements` on one rank
  int64_t elements;
  int64_t world;
  acc_t inv_total;

  // The global element count lives on the device; summing it per thread avoids a sync.
  __device__ void prepare() {
    int64_t total = count ? 0 : elements;
    for (int64_t r = 0; count && r < world; ++r) total += count[r];
    inv_total = acc_t(1) / acc_t(total);
  }
  __device__ Channel channel(int64_t c) const {
    const acc_t sigma_inv = inv_std[c];
    const acc_t mean_dy = sum_dy ? sum_dy[c] * inv_total : acc_t(0);
    const acc_t mean_dy_xmu = sum_dy_xmu ? sum_dy_xmu[c] * inv_total : acc_t(0);
    return {mean[c], mean_dy, sigma_inv * sigma_inv * mean_dy_xmu, weight ? sigma_inv * weight[c] : sigma_inv};
  }
  __device__ acc_t operator()(const Channel& k, const acc_t (&in)[kOperands]) const {
    return (in[0] - k.mean_dy - (in[1] - k.mean) * k.xmu_factor) * k.scale;
  }
};

// The element-wise inputs of an op; a null pointer is an absent optional operand (read as 0).
template <typename scalar_t, int N>
struct Operands {
  const scalar_t* data[N];
};

template <typename scalar_t, int N, int VEC>
struct LoadedOperands {
  AlignedVector<scalar_t, VEC> value[N];
};

template <int VEC, typename scalar_t, int N>
__device__ __forceinline__ LoadedOperands<scalar_t, N, VEC> load_operands(const Operands<scalar_t, N>& operands,
                                                                          int64_t offset) {
  LoadedOperands<scalar_t, N, VEC> loaded;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (operands.data[i]) {
      loaded.value[i] = load_vector<VEC>(operands.data[i], offset);
    } else {
#pragma unroll
      for (int v = 0; v < VEC; ++v) loaded.value[i].value[v] = scalar_t(0);
    }
  }
  return loaded;
}

// out[offset + v] = op(channel_of(v), operands at offset + v) for the VEC elements of one vector.
template <int VEC, typename Op, typename scalar_t, int N, typename ChannelOf>
__device__ __forceinline__ void store_result(const Op& op, const ChannelOf& channel_of,
                                             const LoadedOperands<scalar_t, N, VEC>& loaded, scalar_t* out,
                                             int64_t offset) {
  using acc_t = acc_type<scalar_t>;
  AlignedVector<scalar_t, VEC> result;
#pragma unroll
  for (int v = 0; v < VEC; ++v) {
    acc_t in[N];
#pragma unroll
    for (int i = 0; i < N; ++i) in[i] = acc_t(loaded.value[i].value[v]);
    result.value[v] = scalar_t(op(channel_of(v), in));
  }
  store_vector<VEC>(out, offset, result);
}

// Both kernels walk the tensor from its end. The reduction that runs just before each
// of them (statistics in forward, gradient sums in backward) walks it from the start,
// so the last part it read, up to the L2's size, is still cached when this pass begins.
__device__ __forceinline__ int64_t from_end(int64_t step, int64_t count) { return count - 1 - step; }

// NCHW: threads form [rows][columns] per block; columns walk a plane, rows walk planes.
template <int VEC, typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreads)
    nchw_elementwise_kernel(Op op, Operands<scalar_t, Op::kOperands> operands, scalar_t* out, Layout layout,
                            int columns) {
  op.prepare();
  const int64_t planes = layout.outer * layout.channels;
  const int column = threadIdx.x % columns, rows = kThreads / columns;
  for (int64_t step = int64_t(blockIdx.y) * rows + threadIdx.x / columns; step < planes;
       step += int64_t(gridDim.y) * rows) {
    const int64_t plane = from_end(step, planes);
    const typename Op::Channel channel = op.channel(plane % layout.channels);
    for (int64_t i = (int64_t(blockIdx.x) * columns + column) * VEC; i < layout.inner;
         i += int64_t(gridDim.x) * columns * VEC) {
      const int64_t offset = plane * layout.inner + i;
      store_result<VEC>(op, [&](int) { return channel; }, load_operands<VEC>(operands, offset), out, offset);
    }
  }
}

// Channels-last: threads (x: columns of VEC channels, y: rows of the tensor), blocks
// (x: groups of channels, y: slices of rows). kRowsInFlight rows are loaded before
// any is computed.
template <int VEC, typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreads)
    c_last_elementwise_kernel(Op op, Operands<scalar_t, Op::kOperands> operands, scalar_t* out, Layout layout) {
  using Loaded = LoadedOperands<scalar_t, Op::kOperands, VEC>;
  const int64_t first_channel = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (first_channel >= layout.channels) return;  // VEC divides the channels, so all VEC channels exist
  op.prepare();
  typename Op::Channel channels[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) channels[v] = op.channel(first_channel + v);
  const auto channel_of = [&](int v) { return channels[v]; };
  const int64_t stride = int64_t(gridDim.y) * blockDim.y;
  const auto offset_of = [&](int64_t step) { return from_end(step, layout.outer) * layout.channels + first_channel; };
  for (int64_t step = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; step < layout.outer;
       step += kRowsInFlight * stride) {
    Loaded loaded[kRowsInFlight];
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      if (step + k * stride < layout.outer) loaded[k] = load_operands<VEC>(operands, offset_of(step + k * stride));
    }
#pragma unroll
    for (int k = 0; k < kRowsInFlight; ++k) {
      if (step + k * stride < layout.outer) {
        store_result<VEC>(op, channel_of, loaded[k], out, offset_of(step + k * stride));
      }
    }
  }
}

template <int VEC, typename scalar_t, typename Op>
void launch_nchw(const Op& op, const Operands<scalar_t, Op::kOperands>& operands, scalar_t* out, Layout layout,
                 const Cuda& device) {
  const int columns = std::min(kThreads, next_power_of_two(ceil_div(layout.inner, VEC)));
  const int64_t planes = layout.outer * layout.channels;
  const int64_t max_blocks = int64_t(cuda::sm_count(device.device)) * kBlocksPerSMCap;
  const int64_t blocks_x = std::min(ceil_div(layout.inner, int64_t(columns) * VEC), max_blocks);
  const int64_t blocks_y = std::clamp<int64_t>(max_blocks / blocks_x, 1, ceil_div(planes, kThreads / columns));
  const dim3 grid(blocks_x, std::min<int64_t>(blocks_y, 65535));
  nchw_elementwise_kernel<VEC><<<grid, kThreads, 0, cuda::stream(device)>>>(op, operands, out, layout, columns);
}

template <int VEC, typename scalar_t, typename Op>
void launch_c_last(const Op& op, const Operands<scalar_t, Op::kOperands>& operands, scalar_t* out, Layout layout,
                   const Cuda& device) {
  const auto kernel = c_last_elementwise_kernel<VEC, scalar_t, Op>;
  const int columns = std::min(kThreads, next_power_of_two(ceil_div(layout.channels, VEC)));
  const int rows = kThreads / columns;
  const int64_t blocks_x = ceil_div(layout.channels, int64_t(columns) * VEC);
  // One wave: each thread's per-channel setup is amortised over many rows.
  const int64_t blocks_y = std::clamp<int64_t>(one_wave_blocks(kernel, kThreads, device) / blocks_x, 1,
                                               std::min<int64_t>(ceil_div(layout.outer, rows), 65535));
  kernel<<<dim3(blocks_x, blocks_y), dim3(columns, rows), 0, cuda::stream(device)>>>(op, operands, out, layout);
}

// out = op(inputs...) element-wise; null inputs are absent optional operands.
template <typename scalar_t, typename Op>
void launch_channel_elementwise(const Op& op, const std::array<const void*, Op::kOperands>& inputs, void* out,
                                Layout layout, const Cuda& device, const char* name) {
  constexpr int VEC = vector_width<scalar_t>();
  Operands<scalar_t, Op::kOperands> operands;
  bool aligned = aligned_or_absent(out);
  for (int i = 0; i < Op::kOperands; ++i) {
    operands.data[i] = static_cast<const scalar_t*>(inputs[i]);
    aligned = aligned && aligned_or_absent(inputs[i]);
  }
  scalar_t* out_ptr = static_cast<scalar_t*>(out);
  if (layout.channels_last()) {
    if (aligned && layout.channels % VEC == 0) {
      launch_c_last<VEC>(op, operands, out_ptr, layout, device);
    } else {
      launch_c_last<1>(op, operands, out_ptr, layout, device);
    }
  } else if (aligned && layout.inner % VEC == 0) {
    launch_nchw<VEC>(op, operands, out_ptr, layout, device);
  } else {
    launch_nchw<1>(op, operands, out_ptr, layout, device);
  }
  cuda::check_launch(name);
}

template <typename acc_t>
AffineParams<acc_t> affine_params(const NormalizeArgs& a) {
  return {static_cast<const acc_t*>(a.mean), static_cast<const acc_t*>(a.inv_std), static_cast<const acc_t*>(a.weight),
          static_cast<const acc_t*>(a.shift)};
}

}  // namespace

void batchnorm_forward(const Cuda& device, const NormalizeArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const NormalizeOp<acc_type<T>> op{affine_params<acc_type<T>>(a), a.fuse_relu};
    launch_channel_elementwise<T>(op, {a.input, a.z}, a.out, a.layout, device, "syncbn_batchnorm_forward");
  });
}

void relu_backward(const Cuda& device, const NormalizeArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ReluMaskOp<acc_type<T>> op{affine_params<acc_type<T>>(a)};
    launch_channel_elementwise<T>(op, {a.grad_output, a.input, a.z}, a.out, a.layout, device, "syncbn_relu_bw_c_last");
  });
}

void batchnorm_backward(const Cuda& device, const InputGradArgs& a) {
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_type<T>;
    const InputGradOp<A> op{static_cast<const A*>(a.mean),   static_cast<const A*>(a.inv_std),
                            static_cast<const A*>(a.weight), static_cast<const A*>(a.sum_dy),
                            static_cast<const A*>(a.sum_dy_xmu), a.count, a.elements, a.world, A(0)};
    launch_channel_elementwise<T>(op, {a.grad_output, a.input}, a.grad_input, a.layout, device,
                                  "syncbn_batchnorm_backward");
  });
}

}  // namespace apex::syncbn
