// CUDA back end of row-wise multi-tensor kernels (AdamP's channels, LAMB's per-tensor sums): like
// multi_tensor_apply.cuh, but a functor can be specialised per row of a tensor (at_row) and a
// reduction writes a few sums per row piece instead of one per tensor.
//
// Rows are contiguous runs of `length` elements (a tensor's dim 0 outermost; a 0/1-d tensor is one
// row), cut into pieces of at most kPieceElems elements. A warp takes one contiguous run of the
// launch's pieces (all warps the same count to within one); per piece each lane holds
// kPieceElems / warp size elements per list, read with 16-byte accesses when the piece is aligned.
// A reduction's functor returns Sums<M, N>; the warp adds them up and writes the piece's N sums, so
// what a row's pieces sum to never depends on timing.
#pragma once

#include "apex/multi_tensor_apply.cuh"

namespace apex::multi_tensor {
namespace rows_cuda {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / C10_WARP_SIZE;
// Room left for the functor in the kernel arguments.
constexpr int kReservedArgBytes = 512;

template <int D>
struct RowTable {
  static constexpr int kCapacity =
      (cuda::kArgBytes - kReservedArgBytes - 3 * static_cast<int>(sizeof(int64_t))) / (D * 8 + 4 * 8);
  void* ptrs[D][kCapacity];
  int64_t length[kCapacity];          // elements per row
  int64_t pieces_per_row[kCapacity];
  int64_t piece_end[kCapacity];       // tensor t owns this launch's pieces [piece_end[t - 1], piece_end[t])
  int64_t first_row[kCapacity];       // the index of the tensor's row 0 among the call's rows
  int64_t num_pieces;
  int64_t first_piece;                // this launch's piece 0 among the call's pieces
  int64_t first_tensor;               // this launch's tensor 0 among the call's tensors
  int num_tensors;
};

template <class TL>
struct RowShape {
  static constexpr int kLaneElems = static_cast<int>(kPieceElems) / C10_WARP_SIZE;
  static constexpr int kGroup = std::min(kVectorBytes / TL::kWidestBytes, kLaneElems);  // elements per access
  static constexpr int kAccesses = kLaneElems / kGroup;
};

// Lane's element k of access g in the piece starting at `begin`: whole warps cover contiguous spans.
template <class TL>
__device__ __forceinline__ int64_t piece_index(int64_t begin, int g, int lane) {
  using Shape = RowShape<TL>;
  return begin + (static_cast<int64_t>(g) * C10_WARP_SIZE + lane) * Shape::kGroup;
}

template <class Op, class M, int D, int E, size_t... I>
__device__ __forceinline__ auto call_row_op(const Op& op, M (&x)[D][E], int e, std::index_sequence<I...>) {
  return op(x[I][e]...);
}

// The engine's kernel: kSums 0 for elementwise functors, else the sums per piece written to `sums`.
template <class TL, class Op, int kSums>
__global__ void __launch_bounds__(kThreads)
    rows_kernel(const APEX_GRID_CONSTANT RowTable<TL::kDepth> table, const Op op, float* sums) {
  using M = typename TL::Math;
  using Shape = RowShape<TL>;
  constexpr int D = TL::kDepth;
  const int lane = threadIdx.x % C10_WARP_SIZE;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / C10_WARP_SIZE;
  const int64_t first = table.num_pieces * warp / warps, last = table.num_pieces * (warp + 1) / warps;
  if (first >= last) return;  // warps only: no block-wide synchronisation in this kernel
  int t = cuda::tensor_of_unit(table.piece_end, table.num_tensors, first);
  Op tensor_op = op.at_tensor(table.first_tensor + t);  // at_tensor once per tensor: it may read memory, take powers
  for (int64_t piece = first; piece < last; ++piece) {
    if (table.piece_end[t] <= piece) {
      while (table.piece_end[t] <= piece) ++t;
      tensor_op = op.at_tensor(table.first_tensor + t);
    }
    const int64_t local = piece - (t == 0 ? 0 : table.piece_end[t - 1]);
    const int64_t per_row = table.pieces_per_row[t], length = table.length[t];
    const int64_t row = local / per_row;
    const int64_t begin = row * length + (local - row * per_row) * kPieceElems;
    const int64_t end = min(begin + kPieceElems, (row + 1) * length);
    const auto row_op = tensor_op.at_row(table.first_row[t] + row);
    if (row_op.skip()) {  // a skipped tensor's pieces sum to 0
      if constexpr (kSums > 0) {
        if (lane == 0) {
          for (int k = 0; k < kSums; ++k) sums[(table.first_piece + piece) * kSums + k] = 0.f;
        }
      }
      continue;
    }
    const ListMask reads = row_op.reads(), writes = row_op.writes();

    M x[D][Shape::kLaneElems];
    bool aligned[D];
    cuda::static_for<D>([&](auto d) {
      using T = typename TL::template At<d>;
      aligned[d] = reinterpret_cast<uintptr_t>(static_cast<T*>(table.ptrs[d][t]) + begin) % kVectorBytes == 0;
      if (!(reads & (ListMask{1} << d))) return;
      const T* p = static_cast<const T*>(table.ptrs[d][t]);
#pragma unroll
      for (int g = 0; g < Shape::kAccesses; ++g) {
        load_group<Shape::kGroup>(p, piece_index<TL>(begin, g, lane), end, aligned[d], &x[d][g * Shape::kGroup]);
      }
    });

    float acc[kSums > 0 ? kSums : 1] = {};
#pragma unroll
    for (int e = 0; e < Shape::kLaneElems; ++e) {
      const bool inside = piece_index<TL>(begin, e / Shape::kGroup, lane) + e % Shape::kGroup < end;
      if constexpr (kSums > 0) {
        const auto terms = call_row_op(row_op, x, e, std::make_index_sequence<D>{});
#pragma unroll
        for (int k = 0; k < kSums; ++k) acc[k] += inside ? static_cast<float>(terms.v[k]) : 0.f;
      } else {
        call_row_op(row_op, x, e, std::make_index_sequence<D>{});
      }
    }

    cuda::static_for<D>([&](auto d) {
      using T = typename TL::template At<d>;
      if (!(writes & (ListMask{1} << d))) return;
      T* p = static_cast<T*>(table.ptrs[d][t]);
#pragma unroll
      for (int g = 0; g < Shape::kAccesses; ++g) {
        store_group<Shape::kGroup>(p, piece_index<TL>(begin, g, lane), end, aligned[d], &x[d][g * Shape::kGroup]);
      }
    });

    if constexpr (kSums > 0) {
#pragma unroll
      for (int k = 0; k < kSums; ++k) acc[k] = cuda::warp_reduce<Reduce::kSum>(acc[k]);
      if (lane == 0) {
#pragma unroll
        for (int k = 0; k < kSums; ++k) sums[(table.first_piece + piece) * kSums + k] = acc[k];
      }
    }
  }
}

// One block per tensor: adds up the sums of the tensor's pieces [first_piece, end_piece).
struct PieceRanges {
  static constexpr int kCapacity = (cuda::kArgBytes - kReservedArgBytes) / (2 * 8);
  int64_t first_piece[kCapacity];
  int64_t end_piece[kCapacity];
  int64_t first_tensor;
  int num_tensors;
};

template <int kSums>
__global__ void __launch_bounds__(kThreads)
    sum_pieces_kernel(const APEX_GRID_CONSTANT PieceRanges table, const float* piece_sums, float* sums) {
  const int t = blockIdx.x;
  float acc[kSums] = {};
  for (int64_t piece = table.first_piece[t] + threadIdx.x; piece < table.end_piece[t]; piece += kThreads) {
#pragma unroll
    for (int k = 0; k < kSums; ++k) acc[k] += piece_sums[piece * kSums + k];
  }
#pragma unroll
  for (int k = 0; k < kSums; ++k) {
    const float total = cuda::block_reduce<Reduce::kSum, kThreads>(acc[k]);
    if (threadIdx.x == 0) sums[(table.first_tensor + t) * kSums + k] = total;
  }
}

template <class TL, class Op, int kSums>
int64_t resident_blocks(const Cuda& device) {
  static int cache[64] = {};
  const int per_sm = cuda::per_device(cache, device.device, [] {
    int blocks = 0;
    cuda::check_cuda(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, rows_kernel<TL, Op, kSums>, kThreads, 0),
        "multi-tensor row kernel occupancy");
    return std::max(blocks, 1);
  });
  return static_cast<int64_t>(per_sm) * cuda::sm_count(device.device);
}

}  // namespace rows_cuda

// Runs `op` over every row piece of `lists` (element types TL; lists.rows set; `layout` its
// RowLayout), writing kSums sums per piece to `sums` when kSums > 0.
template <class TL, int kSums, class Op>
void launch_rows(const Cuda& device, const TensorLists& lists, const RowLayout& layout, const Op& op, float* sums) {
  constexpr int D = TL::kDepth;
  using Table = rows_cuda::RowTable<D>;
  static_assert(sizeof(Table) + sizeof(Op) + sizeof(void*) <= cuda::kArgBytes, "kernel arguments too large");
  const int64_t max_blocks = rows_cuda::resident_blocks<TL, Op, kSums>(device);
  Table table;
  table.num_pieces = 0;
  table.num_tensors = 0;
  table.first_tensor = 0;
  table.first_piece = 0;
  auto flush = [&] {
    if (table.num_pieces > 0) {
      const int64_t blocks = std::max<int64_t>(
          1, std::min((table.num_pieces + rows_cuda::kWarps - 1) / rows_cuda::kWarps, max_blocks));
      rows_cuda::rows_kernel<TL, Op, kSums>
          <<<static_cast<unsigned>(blocks), rows_cuda::kThreads, 0, cuda::stream(device)>>>(table, op, sums);
      cuda::check_launch(lists.op);
    }
    table.first_tensor += table.num_tensors;
    table.first_piece += table.num_pieces;
    table.num_pieces = 0;
    table.num_tensors = 0;
  };
  for (int64_t t = 0; t < lists.count; ++t) {
    const int n = table.num_tensors;
    for (int d = 0; d < D; ++d) table.ptrs[d][n] = lists.at(d, t);
    table.length[n] = RowLayout::row_length(lists, t);
    table.pieces_per_row[n] = std::max<int64_t>(RowLayout::pieces_per_row(lists, t), 1);
    table.num_pieces += RowLayout::row_count(lists, t) * RowLayout::pieces_per_row(lists, t);
    table.piece_end[n] = table.num_pieces;
    table.first_row[n] = layout.first_row[t];
    table.num_tensors = n + 1;
    if (table.num_tensors == Table::kCapacity) flush();
  }
  flush();
}

// The tile engine, plus whole-tensor sums: tensor_sums runs `op` (it returns Sums<V, kSums> per
// element) over every element of the lists, as a row pass with one row per tensor, and writes
// sums[t * kSums + k], added in a fixed order; `scratch` holds tensor_sums_scratch(lists, kSums)
// floats.
struct CudaRowEngine : CudaEngine {
  template <class TL, int kSums, class Op>
  static void tensor_sums(const Cuda& device, const TensorLists& lists, const Op& op, float* scratch, float* sums) {
    TensorLists whole = lists;
    whole.rows = nullptr;
    const RowLayout layout(whole);
    launch_rows<TL, kSums>(device, whole, layout, op, scratch);
    rows_cuda::PieceRanges table;
    table.first_tensor = 0;
    table.num_tensors = 0;
    auto flush = [&] {
      if (table.num_tensors > 0) {
        rows_cuda::sum_pieces_kernel<kSums><<<static_cast<unsigned>(table.num_tensors), rows_cuda::kThreads, 0,
                                              cuda::stream(device)>>>(table, scratch, sums);
        cuda::check_launch(lists.op);
      }
      table.first_tensor += table.num_tensors;
      table.num_tensors = 0;
    };
    for (int64_t t = 0; t < lists.count; ++t) {
      const int n = table.num_tensors;
      table.first_piece[n] = layout.first_piece[t];
      table.end_piece[n] = layout.first_piece[t] + RowLayout::row_count(whole, t) * RowLayout::pieces_per_row(whole, t);
      table.num_tensors = n + 1;
      if (table.num_tensors == rows_cuda::PieceRanges::kCapacity) flush();
    }
    flush();
  }
};

}  // namespace apex::multi_tensor
