// LayerNorm / RMSNorm forward on CUDA. One pass over memory: each row is read once into
// registers (16-byte loads), reduced, normalized and written. Rows that are not 16-byte
// aligned, or too wide for registers, take a scalar kernel that reads the row three times
// (the re-reads are mostly cache hits).

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

template <typename T, typename W>
void launch_forward(const Cuda& device, const ForwardArgs& a) {
  using A = Acc<T>;
  const ForwardParams<T, W> p{static_cast<const T*>(a.input),
                              static_cast<const W*>(a.weight),
                              static_cast<const W*>(a.bias),
                              static_cast<W*>(a.output),
                              static_cast<A*>(a.mean),
                              static_cast<A*>(a.invvar),
                              a.rows,
                              static_cast<int>(a.cols),
                              static_cast<A>(a.eps)};
  constexpr int V = vector_width<T>();
  constexpr size_t kOutputAlignment = alignof(AlignedVector<W, V>);
  const bool vectorizable = !std::is_same_v<T, double> && a.cols % V == 0 && is_aligned(p.x) &&
                            is_aligned(p.y, kOutputAlignment) && is_aligned(p.gamma, kOutputAlignment) &&
                            is_aligned(p.beta, kOutputAlignment);
  const int warp = cuda::device_limits(device.device).warp_size;
  const std::optional<RowLayout> layout =
      vectorizable ? register_layout(a.cols / V, warp, kMaxRegisterRowThreads) : std::nullopt;
  const RowLayout shape = layout.value_or(streaming_layout(a.cols, warp));
  const dim3 block(shape.threads_per_row, shape.rows_per_block);
  const int64_t blocks = (a.rows + shape.rows_per_block - 1) / shape.rows_per_block;
  const cudaStream_t stream = cuda::stream(device);
  dispatch_bool(a.rms, [&](auto rms) {
    if (layout) {
      if constexpr (!std::is_same_v<T, double>) {
        dispatch_items(shape.items, [&](auto items) {
          forward_in_registers<T, W, decltype(items)::value, decltype(rms)::value><<<blocks, block, 0, stream>>>(p);
        });
      }
    } else {
      forward_streaming<T, W, decltype(rms)::value><<<blocks, block, 0, stream>>>(p);
    }
  });
  cuda::check_launch(a.rms ? "rms_norm_fwd" : "layer_norm_fwd");
}

}  // namespace

void forward(const Cuda& device, const ForwardArgs& args) {
  dispatch_input_and_output(args.input_dtype, args.output_dtype, [&](auto t, auto w) {
    launch_forward<typename decltype(t)::type, typename decltype(w)::type>(device, args);
  });
}

bool stream_is_capturing(const Cuda& device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cuda::check(cudaStreamIsCapturing(cuda::stream(device), &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace apex::layer_norm
