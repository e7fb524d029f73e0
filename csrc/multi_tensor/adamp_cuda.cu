// CUDA kernels of AdamP: the two row passes (multi_tensor_rows.cuh) and, between them, one block
// per tensor deciding its projection.
#include "adamp.h"
#include "apex/multi_tensor_rows.cuh"

namespace apex::multi_tensor {
namespace {

constexpr int kFinishThreads = 256;

// What the finish kernel needs of each tensor (one block each).
struct FinishTable {
  static constexpr int kCapacity = (cuda::kArgBytes - 512) / (6 * 8);
  int64_t first_piece[kCapacity];
  int64_t pieces_per_row[kCapacity];
  int64_t rows[kCapacity];
  int64_t length[kCapacity];
  int64_t first_row[kCapacity];
  int64_t projectable[kCapacity];
  int64_t first_tensor;
  int num_tensors;
};

// The sums of row r of a tensor: its pieces' sums added in piece order.
__device__ void row_sums(const FinishTable& table, int t, int64_t r, const float* piece_sums,
                         float (&out)[kAdampSums]) {
  for (int k = 0; k < kAdampSums; ++k) out[k] = 0.f;
  const int64_t first = table.first_piece[t] + r * table.pieces_per_row[t];
  for (int64_t piece = first; piece < first + table.pieces_per_row[t]; ++piece) {
    for (int k = 0; k < kAdampSums; ++k) out[k] += piece_sums[piece * kAdampSums + k];
  }
}

__global__ void __launch_bounds__(kFinishThreads)
    adamp_finish_kernel(const APEX_GRID_CONSTANT FinishTable table, const float* piece_sums, float* coefficients,
                        float* decay, const AdampArgs args) {
  __shared__ bool channel, layer;  // the tensor's decision (AdampDecision), for every thread
  __shared__ float totals[kAdampSums];
  const int t = blockIdx.x;
  const int64_t rows = table.rows[t];
  float max_cosine = 0.f, mine[kAdampSums] = {};
  for (int64_t r = threadIdx.x; r < rows; r += kFinishThreads) {
    float sums[kAdampSums];
    row_sums(table, t, r, piece_sums, sums);
    max_cosine = ScalarMath<float>::max(max_cosine, AdampDecision::cosine(sums, args.epsilon));
    for (int k = 0; k < kAdampSums; ++k) mine[k] += sums[k];
  }
  max_cosine = cuda::block_reduce<Reduce::kMax, kFinishThreads>(max_cosine);
  for (int k = 0; k < kAdampSums; ++k) {
    const float total = cuda::block_reduce<Reduce::kSum, kFinishThreads>(mine[k]);
    if (threadIdx.x == 0) totals[k] = total;
  }
  if (threadIdx.x == 0) {
    const float length = static_cast<float>(table.length[t]);
    AdampDecision d;
    d.channel = table.projectable[t] && max_cosine < args.delta / ScalarMath<float>::sqrt(length);
    d.layer = table.projectable[t] && !d.channel &&
              AdampDecision::cosine(totals, args.epsilon) <
                  args.delta / ScalarMath<float>::sqrt(length * static_cast<float>(rows));
    channel = d.channel;
    layer = d.layer;
    decay[table.first_tensor + t] = d.decay(args);
  }
  __syncthreads();
  const float layer_coefficient = layer ? AdampDecision::coefficient(totals, args.epsilon) : 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += kFinishThreads) {
    float coefficient = layer_coefficient;
    if (channel) {
      float sums[kAdampSums];
      row_sums(table, t, r, piece_sums, sums);
      coefficient = AdampDecision::coefficient(sums, args.epsilon);
    }
    coefficients[table.first_row[t] + r] = coefficient;
  }
}

void finish(const Cuda& device, const TensorLists& lists, const RowLayout& layout, const AdampArgs& args,
            const AdampBuffers& buffers) {
  FinishTable table;
  table.first_tensor = 0;
  table.num_tensors = 0;
  auto flush = [&] {
    if (table.num_tensors > 0) {
      adamp_finish_kernel<<<static_cast<unsigned>(table.num_tensors), kFinishThreads, 0, cuda::stream(device)>>>(
          table, buffers.piece_sums, buffers.coefficients, buffers.decay, args);
      cuda::check_launch(lists.op);
    }
    table.first_tensor += table.num_tensors;
    table.num_tensors = 0;
  };
  for (int64_t t = 0; t < lists.count; ++t) {
    const int n = table.num_tensors;
    table.first_piece[n] = layout.first_piece[t];
    table.pieces_per_row[n] = RowLayout::pieces_per_row(lists, t);
    table.rows[n] = RowLayout::row_count(lists, t);
    table.length[n] = RowLayout::row_length(lists, t);
    table.first_row[n] = layout.first_row[t];
    table.projectable[n] = lists.rows[t] > 0;
    table.num_tensors = n + 1;
    if (table.num_tensors == FinishTable::kCapacity) flush();
  }
  flush();
}

}  // namespace

void adamp(const Cuda& device, const TensorLists& lists, int* /*flag*/, const AdampArgs& args,
           const AdampBuffers& buffers) {
  const RowLayout layout(lists);
  AdampStatsFunctor stats;
  stats.a = args;
  AdampApplyFunctor apply;
  apply.a = args;
  apply.coefficients = buffers.coefficients;
  apply.decay = buffers.decay;
  dispatch_floating<false>(lists.dtypes[1], [&](auto p) {
    using Types = TypeList<TypeOf<decltype(p)>, TypeOf<decltype(p)>, float, float>;
    launch_rows<Types, kAdampSums>(device, lists, layout, stats, buffers.piece_sums);
    finish(device, lists, layout, args, buffers);
    launch_rows<Types, 0>(device, lists, layout, apply, nullptr);
  });
}

}  // namespace apex::multi_tensor
