// LayerNorm / RMSNorm backward on CUDA.
//
// grad_input needs two sums per row (of g*dy and of g*dy*xhat); grad_weight / grad_bias are
// sums over rows. The main kernel keeps each row in registers, so x (or y) and dy are read
// once and dx written once; a persistent grid lets every block add its rows' dy*xhat and dy
// into per-block fp32 accumulators in shared memory (each thread owns its columns: no
// atomics), written out once as one partial row per block. A small kernel then sums the
// partial rows. Rows that cannot be vectorized take scalar kernels (two passes per row, and
// a column kernel for the parameter grads that re-reads the inputs).

#include "layer_norm_cuda.cuh"

#include <map>
#include <mutex>
#include <tuple>

namespace apex::layer_norm::cuda {
namespace {

// Row elements per thread in the register-resident backward (2 fp32 registers each).
constexpr int kMaxBackwardElements = 32;

template <typename T, typename W>
struct BackwardParams {
  using A = acc_t<T>;
  const W* dy;
  const T* x_or_y;
  const A* mean;  // nullable (RMSNorm)
  const A* invvar;
  const W* gamma;  // nullable
  const W* beta;   // nullable; read only when memory_efficient
  T* dx;
  A* dgamma_parts;  // [parts, cols] or nullptr when no grad_weight
  A* dbeta_parts;   // [parts, cols] or nullptr when no grad_bias
  int64_t rows;
  int cols;
  A eps;
  bool memory_efficient;

  __device__ NormalizedInput<A> normalizer(int64_t row) const {
    return {mean && !memory_efficient ? mean[row] : A(0), invvar[row], eps, memory_efficient, gamma != nullptr,
            memory_efficient && beta != nullptr};
  }
};

// dx of one element from the row's two means (of g*dy and g*dy*xhat).
template <bool RMS, typename A>
__device__ __forceinline__ A grad_input(A invvar, A gdy, A xhat, A mean_gdy, A mean_gdy_xhat) {
  return invvar * (RMS ? gdy - xhat * mean_gdy_xhat : gdy - mean_gdy - xhat * mean_gdy_xhat);
}

// *acc += add, as whole-vector shared-memory accesses.
template <typename A, int V>
__device__ __forceinline__ void accumulate(Vec<A, V>* acc, const Vec<A, V>& add) {
  Vec<A, V> sum = *acc;
#pragma unroll
  for (int j = 0; j < V; ++j) sum.v[j] += add.v[j];
  *acc = sum;
}

// ITEMS * vec_width<T>() <= kMaxBackwardElements: xhat and gamma * dy of each element stay in registers.
template <typename T, typename W, int ITEMS, bool RMS>
__global__ void __launch_bounds__(kMaxRegisterRowThreads) backward_in_registers(BackwardParams<T, W> p) {
  using A = acc_t<T>;
  constexpr int V = vec_width<T>();
  __shared__ A scratch[2 * kMaxWarps];
  extern __shared__ __align__(2 * kVecBytes) unsigned char accumulator_bytes[];  // Vec<float, 8> alignment
  // [blockDim.y][cols] of dgamma, then of dbeta: one region per row slot of the block.
  A* const accumulators = reinterpret_cast<A*>(accumulator_bytes);
  const int64_t slots = int64_t(blockDim.y) * p.cols;
  A* const acc_gamma = p.dgamma_parts ? accumulators + threadIdx.y * p.cols : nullptr;
  A* const acc_beta = p.dbeta_parts ? accumulators + (p.dgamma_parts ? slots : 0) + threadIdx.y * p.cols : nullptr;
  const int nthreads = blockDim.x * blockDim.y;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t acc_size = slots * ((p.dgamma_parts ? 1 : 0) + (p.dbeta_parts ? 1 : 0));
  for (int64_t i = tid; i < acc_size; i += nthreads) accumulators[i] = A(0);
  __syncthreads();

  const int vecs = p.cols / V;
  const auto* gamma = reinterpret_cast<const Vec<W, V>*>(p.gamma);
  const auto* beta = reinterpret_cast<const Vec<W, V>*>(p.beta);

  // Every block runs the same number of iterations: row_sum synchronizes the whole block.
  for (int64_t first = int64_t(blockIdx.x) * blockDim.y; first < p.rows; first += int64_t(gridDim.x) * blockDim.y) {
    const int64_t row = first + threadIdx.y;
    const bool live = row < p.rows;
    const auto in_row = [&](int k) { return live && int(threadIdx.x) + k * int(blockDim.x) < vecs; };
    const auto index = [&](int k) { return int(threadIdx.x) + k * int(blockDim.x); };

    // All loads of the row first (several 16-byte loads in flight per thread), then the math.
    Vec<T, V> x_raw[ITEMS];
    Vec<W, V> dy_raw[ITEMS];
    const auto* x_row = reinterpret_cast<const Vec<T, V>*>(p.x_or_y + row * p.cols);
    const auto* dy_row = reinterpret_cast<const Vec<W, V>*>(p.dy + row * p.cols);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (!in_row(k)) continue;
      x_raw[k] = x_row[index(k)];
      dy_raw[k] = dy_row[index(k)];
    }
    const NormalizedInput<A> normalize =
        live ? p.normalizer(row) : NormalizedInput<A>{A(0), A(0), p.eps, false, false, false};

    // xhat of the row stays in fp32 registers across the row reduction (with dy as loaded).
    A xhat[ITEMS][V];
    A sums[2] = {A(0), A(0)};  // of gamma * dy and of gamma * dy * xhat
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (!in_row(k)) continue;
      Vec<W, V> g, b;
      if (gamma) g = gamma[index(k)];
      if (beta && p.memory_efficient) b = beta[index(k)];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A gj = gamma ? static_cast<A>(g.v[j]) : A(1);
        const A bj = beta && p.memory_efficient ? static_cast<A>(b.v[j]) : A(0);
        xhat[k][j] = normalize(static_cast<A>(x_raw[k].v[j]), gj, bj);
        const A gdy = gj * static_cast<A>(dy_raw[k].v[j]);
        sums[0] += gdy;
        sums[1] += gdy * xhat[k][j];
      }
    }
    row_sum(sums, scratch);
    const A mean_gdy = sums[0] / p.cols, mean_gdy_xhat = sums[1] / p.cols;

    auto* dx_row = reinterpret_cast<Vec<T, V>*>(p.dx + row * p.cols);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (!in_row(k)) continue;
      Vec<W, V> g;
      if (gamma) g = gamma[index(k)];
      Vec<T, V> out;
      Vec<A, V> dgamma, dbeta;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A d = static_cast<A>(dy_raw[k].v[j]);
        const A gdy = (gamma ? static_cast<A>(g.v[j]) : A(1)) * d;
        out.v[j] = static_cast<T>(grad_input<RMS>(normalize.invvar, gdy, xhat[k][j], mean_gdy, mean_gdy_xhat));
        dgamma.v[j] = d * xhat[k][j];
        dbeta.v[j] = d;
      }
      dx_row[index(k)] = out;
      const int col = index(k) * V;
      if (acc_gamma) accumulate(reinterpret_cast<Vec<A, V>*>(acc_gamma + col), dgamma);
      if (acc_beta) accumulate(reinterpret_cast<Vec<A, V>*>(acc_beta + col), dbeta);
    }
  }

  // Fold the row slots and write this block's partial row.
  __syncthreads();
  for (int c = tid; c < p.cols; c += nthreads) {
    A g = A(0), b = A(0);
    for (int s = 0; s < int(blockDim.y); ++s) {
      if (p.dgamma_parts) g += accumulators[s * p.cols + c];
      if (p.dbeta_parts) b += accumulators[(p.dgamma_parts ? slots : 0) + s * p.cols + c];
    }
    if (p.dgamma_parts) p.dgamma_parts[int64_t(blockIdx.x) * p.cols + c] = g;
    if (p.dbeta_parts) p.dbeta_parts[int64_t(blockIdx.x) * p.cols + c] = b;
  }
}

// Scalar grad_input for any width and alignment: one pass for the sums, one for dx.
template <typename T, typename W, bool RMS>
__global__ void backward_streaming(BackwardParams<T, W> p) {
  using A = acc_t<T>;
  __shared__ A scratch[2 * kMaxWarps];
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < p.rows;
  const int end = live ? p.cols : 0;
  const T* x = p.x_or_y + row * p.cols;
  const W* dy = p.dy + row * p.cols;
  const NormalizedInput<A> normalize =
      live ? p.normalizer(row) : NormalizedInput<A>{A(0), A(0), p.eps, false, false, false};
  const auto element = [&](int c, A& xhat, A& gdy) {
    const A g = p.gamma ? static_cast<A>(p.gamma[c]) : A(1);
    xhat = normalize(static_cast<A>(x[c]), g, p.beta ? static_cast<A>(p.beta[c]) : A(0));
    gdy = g * static_cast<A>(dy[c]);
  };

  A sums[2] = {A(0), A(0)};
  for (int c = threadIdx.x; c < end; c += blockDim.x) {
    A xhat, gdy;
    element(c, xhat, gdy);
    sums[0] += gdy;
    sums[1] += gdy * xhat;
  }
  row_sum(sums, scratch);
  const A mean_gdy = sums[0] / p.cols, mean_gdy_xhat = sums[1] / p.cols;
  for (int c = threadIdx.x; c < end; c += blockDim.x) {
    A xhat, gdy;
    element(c, xhat, gdy);
    p.dx[row * p.cols + c] = static_cast<T>(grad_input<RMS>(normalize.invvar, gdy, xhat, mean_gdy, mean_gdy_xhat));
  }
}

// Parameter grads for the scalar path: block (kFoldColumns, kFoldRows) sums a column strip over
// a chunk of rows; blockIdx.y picks the chunk, which is also the partial row written.
template <typename T, typename W>
__global__ void parameter_grads_by_columns(BackwardParams<T, W> p, int64_t rows_per_chunk) {
  using A = acc_t<T>;
  const int c = blockIdx.x * kFoldColumns + threadIdx.x;
  const int64_t first = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t last = min(first + rows_per_chunk, p.rows);
  A dgamma = A(0), dbeta = A(0);
  if (c < p.cols) {
    const A g = p.gamma ? static_cast<A>(p.gamma[c]) : A(1);
    const A b = p.beta ? static_cast<A>(p.beta[c]) : A(0);
    for (int64_t r = first + threadIdx.y; r < last; r += kFoldRows) {
      const A d = static_cast<A>(p.dy[r * p.cols + c]);
      dgamma += d * p.normalizer(r)(static_cast<A>(p.x_or_y[r * p.cols + c]), g, b);
      dbeta += d;
    }
  }
  dgamma = column_sum(dgamma);
  __syncthreads();  // column_sum's buffer is reused
  dbeta = column_sum(dbeta);
  if (threadIdx.y == 0 && c < p.cols) {
    if (p.dgamma_parts) p.dgamma_parts[blockIdx.y * int64_t(p.cols) + c] = dgamma;
    if (p.dbeta_parts) p.dbeta_parts[blockIdx.y * int64_t(p.cols) + c] = dbeta;
  }
}

// How many blocks of `kernel` an SM holds with this block size and dynamic shared memory; cached,
// since the CUDA queries cost microseconds on every call otherwise.
int resident_blocks_per_sm(const void* kernel, int threads, size_t smem) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t, int>, int> cache;
  const int device = c10::cuda::current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  auto [entry, fresh] = cache.try_emplace({kernel, threads, smem, device}, 0);
  if (fresh) {
    // Allow all the opt-in shared memory the kernel's static arrays leave, so any later size launches too.
    cudaFuncAttributes attributes;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    const size_t optin = at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(optin - attributes.sharedSizeBytes)));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&entry->second, kernel, threads, smem));
  }
  return std::max(entry->second, 1);
}

// out[c] = sum over the partial rows of parts[:, c].
template <typename A, typename W>
__global__ void sum_partial_rows(const A* parts, int64_t num_parts, int cols, W* out) {
  const int c = blockIdx.x * kFoldColumns + threadIdx.x;
  A total = A(0);
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < num_parts; r += kFoldRows) total += parts[r * cols + c];
  }
  total = column_sum(total);
  if (threadIdx.y == 0 && c < cols) out[c] = static_cast<W>(total);
}

template <typename T, typename W>
void launch_backward(const BackwardArgs& a) {
  using A = acc_t<T>;
  constexpr int V = vec_width<T>();
  BackwardParams<T, W> p{a.grad_output.const_data_ptr<W>(),
                         a.input_or_output.const_data_ptr<T>(),
                         a.rms ? nullptr : a.mean.const_data_ptr<A>(),
                         a.invvar.const_data_ptr<A>(),
                         data_or_null<W>(a.weight),
                         data_or_null<W>(a.bias),
                         a.grad_input.mutable_data_ptr<T>(),
                         nullptr,
                         nullptr,
                         a.rows,
                         static_cast<int>(a.cols),
                         static_cast<A>(a.eps),
                         a.memory_efficient};
  const bool want_dgamma = a.grad_weight.defined(), want_dbeta = a.grad_bias.defined();
  const int accumulators = int(want_dgamma) + int(want_dbeta);
  const auto* props = at::cuda::getCurrentDeviceProperties();
  auto stream = at::cuda::getCurrentCUDAStream();
  const auto parts_options = a.grad_output.options().dtype(statistics_dtype(a.input_or_output.scalar_type()));
  at::Tensor dgamma_parts, dbeta_parts;
  const auto allocate_parts = [&](int64_t parts) {
    if (want_dgamma) dgamma_parts = at::empty({parts, a.cols}, parts_options);
    if (want_dbeta) dbeta_parts = at::empty({parts, a.cols}, parts_options);
    p.dgamma_parts = want_dgamma ? dgamma_parts.mutable_data_ptr<A>() : nullptr;
    p.dbeta_parts = want_dbeta ? dbeta_parts.mutable_data_ptr<A>() : nullptr;
  };

  const bool vectorizable = !std::is_same_v<T, double> && a.cols % V == 0 && is_aligned(p.x_or_y, kVecBytes) &&
                            is_aligned(p.dx, kVecBytes) && is_aligned(p.dy, alignof(Vec<W, V>)) &&
                            is_aligned(p.gamma, alignof(Vec<W, V>)) && is_aligned(p.beta, alignof(Vec<W, V>));
  std::optional<RowLayout> layout =
      vectorizable ? register_layout(a.cols / V, kMaxRegisterRowThreads, kMaxBackwardElements / V) : std::nullopt;
  const size_t smem = layout ? size_t(layout->rows_per_block) * a.cols * sizeof(A) * accumulators : 0;
  // Leave room for the kernels' static shared memory (the row reduction's scratch).
  if (smem + 1024 > props->sharedMemPerBlockOptin) layout.reset();

  if (layout) {
    if constexpr (!std::is_same_v<T, double>) {
      const dim3 block(layout->threads_per_row, layout->rows_per_block);
      const int64_t row_blocks = (a.rows + layout->rows_per_block - 1) / layout->rows_per_block;
      dispatch_bool(a.rms, [&](auto rms) {
        dispatch_items(layout->items, [&](auto items) {
          constexpr int kItems = std::min(decltype(items)::value, kMaxBackwardElements / V);
          auto kernel = backward_in_registers<T, W, kItems, decltype(rms)::value>;
          const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), block.x * block.y, smem);
          const int64_t blocks = std::min<int64_t>(row_blocks, int64_t(per_sm) * props->multiProcessorCount);
          allocate_parts(blocks);
          kernel<<<blocks, block, smem, stream>>>(p);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
    }
  } else {
    const RowLayout shape = streaming_layout(a.cols);
    const int64_t blocks = (a.rows + shape.rows_per_block - 1) / shape.rows_per_block;
    dispatch_bool(a.rms, [&](auto rms) {
      backward_streaming<T, W, decltype(rms)::value>
          <<<blocks, dim3(shape.threads_per_row, shape.rows_per_block), 0, stream>>>(p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    if (accumulators > 0) {
      const int64_t column_blocks = (a.cols + kFoldColumns - 1) / kFoldColumns;
      // Enough row chunks to give every SM a few blocks, each chunk at least kFoldRows rows.
      const int64_t wanted = std::max<int64_t>(1, 4 * props->multiProcessorCount / column_blocks);
      const int64_t chunks = std::min<int64_t>(wanted, (a.rows + kFoldRows - 1) / kFoldRows);
      const int64_t rows_per_chunk = (a.rows + chunks - 1) / chunks;
      allocate_parts(chunks);
      parameter_grads_by_columns<T, W>
          <<<dim3(column_blocks, chunks), dim3(kFoldColumns, kFoldRows), 0, stream>>>(p, rows_per_chunk);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }

  const auto finish = [&](const at::Tensor& parts, const at::Tensor& out) {
    sum_partial_rows<A, W><<<(a.cols + kFoldColumns - 1) / kFoldColumns, dim3(kFoldColumns, kFoldRows), 0, stream>>>(
        parts.const_data_ptr<A>(), parts.size(0), static_cast<int>(a.cols), out.mutable_data_ptr<W>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (want_dgamma) finish(dgamma_parts, a.grad_weight);
  if (want_dbeta) finish(dbeta_parts, a.grad_bias);
}

}  // namespace

void backward_cuda(const BackwardArgs& a) {
  on_device(a.input_or_output, a.cols, a.input_or_output.scalar_type(), a.grad_output.scalar_type(),
            "fused_layer_norm backward (CUDA)",
            [&](auto t, auto w) { launch_backward<decltype(t), decltype(w)>(a); });
}

}  // namespace apex::layer_norm::cuda
