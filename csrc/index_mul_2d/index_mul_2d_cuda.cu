// index_mul_2d: CUDA kernels.
//
// Forward: a 2-D grid (apex/row_grid.cuh) walks [rows, features] in 16-byte packs, each thread
// kForwardRows rows at a time; each row reads its index once and gathers the in1 pack it needs.
//
// Backward passes: grad_in1[s] sums a product over every row whose index is s. This file used to
// add each row's products into a float copy of grad_in1 with float4 atomics: on the benchmark's
// shape (2M rows x 64 features into 50000 sources, rows in random order) that is 128M float adds
// in L2, and they held the bf16 backward to 0.67 ms on an H100 where its bytes need ~0.27 ms; the
// sums also came out in a different order every run. What was weighed instead:
//   - fewer atomics: pre-adding equal neighbouring indices within a warp only helps an index that is
//     already grouped (random rows almost never share a source with their neighbours); packed bf16
//     atomics round every addition; whole-sector float4 reductions still leave 16M L2 updates.
//   - a sorted index, detected on the device: choosing a path on the host needs a sync (no CUDA
//     graphs, no torch.compile), and the path below already streams a sorted index in row order.
//   - sorting the rows by source, then one pass that reduces each source's rows in registers (the
//     path taken). No atomics; every sum in a fixed order (deterministic); grad_in1 written once,
//     in its own dtype (no float accumulator to zero and convert); in1[s] read once per source.
// Its price is the sort, ~56 bytes a row besides the index (8-byte keys written, a stable radix
// sort over the source's bits only: a histogram pass and 2 passes of 8 bits for 50000 sources, and
// the reducing pass re-reading the keys) next to the 3 x 128 bytes of the bf16 rows at 64 features,
// and reading the rows in source order: whole rows at scattered places rather than one stream (each
// row one or more whole 128-byte lines; an index that is already sorted streams).
//
// The reducing pass (segment_kernel): the sorted order is cut into ranges of equal length, a warp
// each (a block stages its warps' ranges of keys in shared memory). A warp walks its range piece by
// piece (a piece: the range's rows of one source), lanes across a row's packs and groups of lanes
// over the piece's rows, and writes each row's other gradient as it goes. A source whose rows all
// lie in the range gets its sum written at once; one that crosses a range boundary leaves a partial
// sum per range, which join_kernel adds up in range order. Rows with an invalid index sort last
// (their key is `sources`) and get NaN rows.
#include <algorithm>
#include <limits>

#include "apex/acc_type.h"
#include "apex/block_reduce.cuh"  // cuda::shuffle_xor
#include "apex/cuda.cuh"
#include "apex/occupancy.cuh"
#include "apex/row_grid.cuh"
#include "index_mul_2d.h"
#include "index_mul_2d_sort.cuh"

namespace apex::index_mul_2d {
namespace {

template <class Acc, int kVec>
using Values = AlignedVector<Acc, kVec>;

template <class Acc, int kVec>
C10_DEVICE Values<Acc, kVec> filled(Acc value) {
  Values<Acc, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.value[k] = value;
  return out;
}

template <class Acc, int kVec, class T>
C10_DEVICE Values<Acc, kVec> convert(const AlignedVector<T, kVec>& pack) {
  Values<Acc, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.value[k] = static_cast<Acc>(pack.value[k]);
  return out;
}

// kVec values of T at offset, as Acc; zeros for a null tensor (an unused double-backward input).
template <class Acc, int kVec, class T>
C10_DEVICE Values<Acc, kVec> load(const T* base, int64_t offset) {
  if (base == nullptr) return filled<Acc, kVec>(Acc(0));
  return convert<Acc>(load_vector<kVec>(base, offset));
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
  return filled<Acc, kVec>(std::numeric_limits<Acc>::quiet_NaN());
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

// sum += a * b, element-wise.
template <class Acc, int kVec>
C10_DEVICE void add_product(Values<Acc, kVec>& sum, const Values<Acc, kVec>& a, const Values<Acc, kVec>& b) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) sum.value[k] += a.value[k] * b.value[k];
}

// ---- accesses to rows that are read or written once -----------------------------------------------

// The unsigned type of `kBytes` bytes that one load or store instruction moves.
template <int kBytes>
struct BitsOf;
template <> struct BitsOf<2> { using type = unsigned short; };
template <> struct BitsOf<4> { using type = unsigned int; };
template <> struct BitsOf<8> { using type = uint2; };
template <> struct BitsOf<16> { using type = uint4; };

// A pack as the bits it was loaded as. Batches of loads are held in this form until used: held as
// AlignedVector<BFloat16, 8>, nvcc gives every 16-bit element a register of its own (ptxas spilled
// them: STL.S16 in the SASS), twice the registers of the 4 words.
template <class T, int kVec>
using Raw = typename BitsOf<sizeof(T) * kVec>::type;

template <class Acc, class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE Values<Acc, kVec> unpack(const Raw<T, kVec>& raw) {
  AlignedVector<T, kVec> pack;
  memcpy(&pack, &raw, sizeof(pack));
  return convert<Acc>(pack);
}

template <int kVec, class T>
C10_DEVICE C10_ALWAYS_INLINE Raw<T, kVec> load_raw(const T* base, int64_t offset) {
  return *reinterpret_cast<const Raw<T, kVec>*>(base + offset);
}

// A pack of a row read once (in2, grad_out, grad_grad_in2 rows): an evict-first load (ld.global.cs),
// so that hundreds of MB streaming through L2 do not push out in1 (6-13 MB on the benchmark), whose
// rows every row gathers again.
template <int kVec, class T>
C10_DEVICE C10_ALWAYS_INLINE Raw<T, kVec> load_raw_once(const T* base, int64_t offset) {
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  return __ldcs(reinterpret_cast<const Raw<T, kVec>*>(base + offset));
#else
  return load_raw<kVec>(base, offset);
#endif
}

// The store twin (st.global.cs): one instruction per pack, as apex/aligned_vector.cuh's
// store_vector, with the evict-first hint.
template <int kVec, class T, class Acc>
C10_DEVICE C10_ALWAYS_INLINE void store_once(T* base, int64_t offset, const Values<Acc, kVec>& values) {
  AlignedVector<T, kVec> pack;
#pragma unroll
  for (int k = 0; k < kVec; ++k) pack.value[k] = static_cast<T>(values.value[k]);
#if defined(__CUDA_ARCH__) && !defined(USE_ROCM)
  using Bits = typename BitsOf<sizeof(T) * kVec>::type;
  Bits bits;
  memcpy(&bits, &pack, sizeof(bits));
  __stcs(reinterpret_cast<Bits*>(base + offset), bits);
#else
  store_vector<kVec>(base, offset, pack);
#endif
}

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / C10_WARP_SIZE;

// ---- forward ---------------------------------------------------------------------------------------

// Each thread takes kForwardRows rows a step (rows a grid-height apart, so a warp's accesses stay
// row-contiguous), issuing all their index loads, then all their in1 gathers and in2 loads, before it
// uses any. The previous kernel had one row's loads in flight per thread, each gather waiting on its
// index load: 64 KB in flight per SM, short of what the fp32 stream needs at H200 latency (83% of
// copy against bf16's 88%; this one measured 87.7% fp32, 87.2% bf16, session 27).
constexpr int kForwardRows = 4;
// 768 threads an SM at <= 80 registers (ptxas -v, sm_90: 51-80, no spills).
constexpr int kForwardRowsBlocksPerSm = 3;

template <class T, int kVec>
__global__ void __launch_bounds__(kThreads, kForwardRowsBlocksPerSm) forward_rows_kernel(Args args) {
  using Acc = acc_type<T>;
  const T* in1 = static_cast<const T*>(args.in1);
  const T* in2 = static_cast<const T*>(args.in2);
  T* out = static_cast<T*>(args.out);
  const int64_t rows = args.rows, features = args.features, packs = features / kVec;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  const int64_t pack_step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; first < rows;
       first += step * kForwardRows) {
    int64_t source[kForwardRows];
    bool has[kForwardRows], valid[kForwardRows];
#pragma unroll
    for (int j = 0; j < kForwardRows; ++j) {
      const int64_t row = first + j * step;
      has[j] = row < rows;
      source[j] = has[j] ? args.index[row] : 0;
      if (source[j] < 0) source[j] += args.sources;
      valid[j] = has[j] && source[j] >= 0 && source[j] < args.sources;
    }
    for (int64_t pack = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pack < packs; pack += pack_step) {
      Raw<T, kVec> a[kForwardRows], b[kForwardRows];
#pragma unroll
      for (int j = 0; j < kForwardRows; ++j) {
        if (!valid[j]) continue;
        a[j] = load_raw<kVec>(in1, source[j] * features + pack * kVec);
        b[j] = load_raw_once<kVec>(in2, (first + j * step) * features + pack * kVec);
      }
#pragma unroll
      for (int j = 0; j < kForwardRows; ++j) {
        if (!has[j]) continue;
        store_once<kVec>(out, (first + j * step) * features + pack * kVec,
                         valid[j] ? mul(unpack<Acc, T, kVec>(a[j]), unpack<Acc, T, kVec>(b[j]))
                                  : nan_values<Acc, kVec>());
      }
    }
  }
}

template <class T, int kVec>
void forward(const Cuda& device, const Args& args) {
  // Rows in steps of kForwardRows: the grid covers that many fewer row slots.
  const cuda::RowGrid grid = cuda::row_grid((args.rows + kForwardRows - 1) / kForwardRows, args.features / kVec,
                                            device, kThreads, kForwardRowsBlocksPerSm);
  forward_rows_kernel<T, kVec><<<grid.grid, grid.block, 0, cuda::stream(device)>>>(args);
}

// ---- backward passes: the sorted index ------------------------------------------------------------

// A row's key in the sorted order: its source in the high bits (`sources` for an invalid index, so
// that those rows sort last), the row in the low row_bits bits (so equal sources keep row order).
struct Keys {
  int row_bits;

  C10_HOST_DEVICE uint64_t make(uint64_t source, uint64_t row) const { return source << row_bits | row; }
  C10_HOST_DEVICE uint64_t source(uint64_t key) const { return key >> row_bits; }
  C10_HOST_DEVICE int64_t row(uint64_t key) const {
    return static_cast<int64_t>(key & ((uint64_t{1} << row_bits) - 1));
  }
};

// Stands for the positions before the first and past the last: its source (all ones) is above
// every real key's, whose top bit is clear (plan_keys leaves one bit spare).
constexpr uint64_t kNoKey = ~uint64_t{0};

inline int bit_width(uint64_t value) {
  int bits = 0;
  for (; value != 0; value >>= 1) ++bits;
  return bits;
}

__global__ void __launch_bounds__(kThreads) keys_kernel(const int64_t* index, int64_t rows, int64_t sources,
                                                         Keys keys, uint64_t* out) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < rows; row += step) {
    int64_t source = index[row];
    if (source < 0) source += sources;
    const bool valid = source >= 0 && source < sources;
    out[row] = keys.make(static_cast<uint64_t>(valid ? source : sources), static_cast<uint64_t>(row));
  }
}

// ---- backward passes: the reducing walk -----------------------------------------------------------

// How segment_kernel cuts the sorted order: ranges of `range` positions (a warp's work; the last
// one shorter), and lanes per row (a power of two: lanes / lanes-per-row rows at a time per warp).
struct Walk {
  int64_t range;
  int64_t ranges;
  int lanes;
};

// A range's keys are staged in shared memory, so at most this many positions (4 KiB a block).
constexpr int kMaxRange = 128;
// Each warp should get a few ranges (equal lengths, so equal work up to the pieces' overheads) and
// each range several rows per source piece: ranges are no shorter than this.
constexpr int kMinRange = 32;
constexpr int kRangesPerWarp = 4;

// The reducing walk's blocks: 4 warps (small blocks, as a block waits at each staging barrier for its
// slowest warp), at least kSegmentBlocksPerSm of them an SM, which caps a thread at 102 registers.
constexpr int kSegmentThreads = 128;
constexpr int kSegmentWarps = kSegmentThreads / C10_WARP_SIZE;
constexpr int kSegmentBlocksPerSm = 5;

// Rows each group of lanes loads before it uses them (a batch's loads are in flight together), as
// many as fit the register cap without spilling (ptxas -v, sm_90: 84-96 registers): each 16-bit
// row costs 2 packs and their float conversions, the double backward's 3.
template <Pass kPass, class T>
constexpr int kRowsInFlight = sizeof(T) < 4 ? (kPass == Pass::kDoubleBackward ? 1 : 2)
                                            : (kPass == Pass::kDoubleBackward ? 2 : 4);

// The first position in (p, n] whose key's source is not `source` (positions p.. of at[] hold
// sorted keys; at[n] is the range's next key).
C10_DEVICE C10_ALWAYS_INLINE int piece_end(const uint64_t* at, Keys keys, int p, int n, uint64_t source) {
  int low = p + 1, high = n;
  while (low < high) {
    const int middle = (low + high) / 2;
    if (keys.source(at[middle]) == source) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  return low;
}

// The sum of `v` over the lanes of the warp that hold the same packs (lanes apart by multiples of
// `lanes`), in a fixed order; every lane gets its packs' sum.
template <class Acc, int kVec>
C10_DEVICE C10_ALWAYS_INLINE Values<Acc, kVec> sum_over_groups(Values<Acc, kVec> v, int lanes) {
  for (int offset = lanes; offset < C10_WARP_SIZE; offset *= 2) {
    const Values<Acc, kVec> other = cuda::shuffle_xor(v, offset);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v.value[k] += other.value[k];
  }
  return v;
}

// Positions [p, q) of the staged keys `at` are rows of one valid source: writes their row-wise
// gradients, and their sum into grad_in1[source] (partial == null) or into the range's partial.
template <class T, int kVec, Pass kPass>
C10_DEVICE void reduce_piece(const Args& args, Keys keys, int lanes, const uint64_t* at, int p, int q, int64_t source,
                             acc_type<T>* partial) {
  using Acc = acc_type<T>;
  constexpr int kBatch = kRowsInFlight<kPass, T>;
  const T* in1 = static_cast<const T*>(args.in1);
  const T* in2 = static_cast<const T*>(args.in2);
  const T* grad_out = static_cast<const T*>(args.grad_out);
  const T* gg1 = static_cast<const T*>(args.grad_grad_in1);
  const T* gg2 = static_cast<const T*>(args.grad_grad_in2);
  T* out = static_cast<T*>(args.out);
  T* out2 = static_cast<T*>(args.out2);
  const int lane = static_cast<int>(threadIdx.x) % C10_WARP_SIZE;
  const int group = lane / lanes, groups = C10_WARP_SIZE / lanes;
  const int64_t features = args.features, packs = features / kVec;
  // Every lane runs every loop below the same number of times: sum_over_groups needs the whole warp.
  for (int64_t chunk = 0; chunk < packs; chunk += lanes) {
    const int64_t pack = chunk + lane % lanes;
    const bool active = pack < packs;
    const int64_t at_source = source * features + pack * kVec;
    const Values<Acc, kVec> x1 = active ? load<Acc, kVec>(in1, at_source) : filled<Acc, kVec>(Acc(0));
    Values<Acc, kVec> h1 = filled<Acc, kVec>(Acc(0));
    if constexpr (kPass == Pass::kDoubleBackward) {
      if (active) h1 = load<Acc, kVec>(gg1, at_source);
    }
    Values<Acc, kVec> sum = filled<Acc, kVec>(Acc(0));
    for (int base = p; base < q; base += groups * kBatch) {
      int64_t at_row[kBatch];
      bool has[kBatch];
      AlignedVector<T, kVec> g[kBatch], y[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int position = base + i * groups + group;
        has[i] = active && position < q;
        at_row[i] = has[i] ? keys.row(at[position]) * features + pack * kVec : 0;
      }
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (!has[i]) continue;
        g[i] = load_vector<kVec>(grad_out, at_row[i]);
        y[i] = load_vector<kVec>(in2, at_row[i]);
      }
      if constexpr (kPass == Pass::kBackward) {
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          if (!has[i]) continue;
          const Values<Acc, kVec> gi = convert<Acc>(g[i]);
          store<kVec>(out, at_row[i], mul(gi, x1));             // grad_in2 = grad_out * in1[s]
          add_product(sum, gi, convert<Acc>(y[i]));             // grad_in1[s] += grad_out * in2
        }
      } else {
        Values<Acc, kVec> h2[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) h2[i] = has[i] ? load<Acc, kVec>(gg2, at_row[i]) : filled<Acc, kVec>(Acc(0));
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          if (!has[i]) continue;
          const Values<Acc, kVec> gi = convert<Acc>(g[i]);
          store<kVec>(out, at_row[i], mul_add(h1, convert<Acc>(y[i]), x1, h2[i]));  // grad_grad_out
          store<kVec>(out2, at_row[i], mul(h1, gi));                                // grad_in2
          add_product(sum, h2[i], gi);                                              // grad_in1[s]
        }
      }
    }
    sum = sum_over_groups(sum, lanes);
    if (group != 0 || !active) continue;
    if (partial != nullptr) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) partial[pack * kVec + k] = sum.value[k];
    } else {
      store<kVec>(static_cast<T*>(args.grad_in1), at_source, sum);
    }
  }
}

// Positions [p, q) of `at` are rows with an invalid index: NaN rows.
template <class T, int kVec, Pass kPass>
C10_DEVICE void write_invalid_rows(const Args& args, Keys keys, int lanes, const uint64_t* at, int p, int q) {
  using Acc = acc_type<T>;
  const int lane = static_cast<int>(threadIdx.x) % C10_WARP_SIZE;
  const int group = lane / lanes, groups = C10_WARP_SIZE / lanes;
  const int64_t features = args.features, packs = features / kVec;
  for (int64_t pack = lane % lanes; pack < packs; pack += lanes) {
    for (int position = p + group; position < q; position += groups) {
      const int64_t at_row = keys.row(at[position]) * features + pack * kVec;
      store<kVec>(static_cast<T*>(args.out), at_row, nan_values<Acc, kVec>());
      if constexpr (kPass == Pass::kDoubleBackward) store<kVec>(static_cast<T*>(args.out2), at_row, nan_values<Acc, kVec>());
    }
  }
}

// One warp's range [begin, end) of the sorted order; at[i] is the key at position begin + i, for
// i in [-1, end - begin] (kNoKey outside the order). A piece whose source began before the range is
// its "continuing" partial (slot 2 * range), one whose source goes on past it its "opening" partial
// (slot 2 * range + 1); a source that does both is continuing.
template <class T, int kVec, Pass kPass>
C10_DEVICE void walk_range(const Args& args, Keys keys, const Walk& walk, const uint64_t* at, int64_t begin,
                           int64_t end, acc_type<T>* partials) {
  const int n = static_cast<int>(end - begin);
  const int64_t range = begin / walk.range;
  const uint64_t invalid = static_cast<uint64_t>(args.sources);
  for (int p = 0; p < n;) {
    const uint64_t source = keys.source(at[p]);
    const int q = piece_end(at, keys, p, n, source);
    if (source >= invalid) {
      write_invalid_rows<T, kVec, kPass>(args, keys, walk.lanes, at, p, q);
    } else {
      const bool continuing = p == 0 && keys.source(at[-1]) == source;
      const bool opening = !continuing && q == n && keys.source(at[n]) == source;
      acc_type<T>* partial = continuing ? partials + 2 * range * args.features
                             : opening  ? partials + (2 * range + 1) * args.features
                                        : nullptr;
      reduce_piece<T, kVec, kPass>(args, keys, walk.lanes, at, p, q, static_cast<int64_t>(source), partial);
    }
    p = q;
  }
}

template <class T, int kVec, Pass kPass>
__global__ void __launch_bounds__(kSegmentThreads, kSegmentBlocksPerSm)
    segment_kernel(Args args, const uint64_t* sorted, Keys keys, Walk walk, acc_type<T>* partials) {
  // The block's kSegmentWarps ranges of keys, with the key before them and the one after.
  __shared__ uint64_t staged[kSegmentWarps * kMaxRange + 2];
  const int warp = static_cast<int>(threadIdx.x) / C10_WARP_SIZE;
  const int64_t span = kSegmentWarps * walk.range;
  for (int64_t first = blockIdx.x * span; first < args.rows; first += static_cast<int64_t>(gridDim.x) * span) {
    const int64_t last = std::min(first + span, args.rows);
    __syncthreads();  // the previous ranges' readers are done
    for (int64_t i = threadIdx.x; i < last - first + 2; i += blockDim.x) {
      const int64_t position = first - 1 + i;
      staged[i] = position >= 0 && position < args.rows ? sorted[position] : kNoKey;
    }
    __syncthreads();
    const int64_t begin = first + warp * walk.range;
    if (begin < last) {
      walk_range<T, kVec, kPass>(args, keys, walk, staged + (begin - first) + 1, begin,
                                 std::min(begin + walk.range, last), partials);
    }
  }
}

// grad_in1 of each source that crosses a range boundary: its opening partial plus the continuing
// partials of the ranges after it, in range order. A warp per range that opens one.
template <class T>
__global__ void __launch_bounds__(kThreads) join_kernel(Args args, const uint64_t* sorted, Keys keys, Walk walk,
                                                         const acc_type<T>* partials) {
  using Acc = acc_type<T>;
  const int lane = static_cast<int>(threadIdx.x) % C10_WARP_SIZE;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t features = args.features, rows = args.rows;
  T* grad_in1 = static_cast<T*>(args.grad_in1);
  for (int64_t range = blockIdx.x * kWarps + threadIdx.x / C10_WARP_SIZE; range < walk.ranges; range += warps) {
    const int64_t begin = range * walk.range, end = std::min(begin + walk.range, rows);
    if (end >= rows) continue;
    const uint64_t source = keys.source(sorted[end - 1]);
    if (source >= static_cast<uint64_t>(args.sources) || keys.source(sorted[end]) != source) continue;
    if (begin > 0 && keys.source(sorted[begin - 1]) == source) continue;  // opened by an earlier range
    for (int64_t f = lane; f < features; f += C10_WARP_SIZE) {
      Acc total = partials[(2 * range + 1) * features + f];
      for (int64_t next = range + 1;; ++next) {
        total += partials[2 * next * features + f];
        const int64_t next_end = (next + 1) * walk.range;
        if (next_end >= rows || keys.source(sorted[next_end]) != source) break;
      }
      grad_in1[static_cast<int64_t>(source) * features + f] = static_cast<T>(total);
    }
  }
}

// ---- backward passes: planning and launching ------------------------------------------------------

constexpr size_t kScratchAlignment = 256;

size_t aligned_bytes(size_t bytes) { return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment; }

Walk plan_walk(const Args& args, int kVec, int64_t resident_warps) {
  const int64_t packs = args.features / kVec;
  int lanes = 1;
  while (lanes < C10_WARP_SIZE && lanes < packs) lanes *= 2;
  const int64_t per_warp = resident_warps * kRangesPerWarp;
  const int64_t range = std::clamp<int64_t>((args.rows + per_warp - 1) / per_warp, kMinRange, kMaxRange);
  return {range, (args.rows + range - 1) / range, lanes};
}

template <class T, int kVec, Pass kPass>
void backward(const Cuda& device, const Args& args, const Scratch& scratch) {
  using Acc = acc_type<T>;
  const cudaStream_t stream = cuda::stream(device);
  const Keys keys{bit_width(static_cast<uint64_t>(args.rows - 1))};
  // Sort on the source's bits only (at least one: the invalid key of an empty in1 is 0).
  const int begin_bit = keys.row_bits;
  const int end_bit = begin_bit + std::max(1, bit_width(static_cast<uint64_t>(args.sources)));
  if (end_bit > 63) {  // kNoKey needs a spare top bit; ~2^63 rows x sources of memory would come first
    throw std::runtime_error("index_mul_2d: rows x sources too large to sort (more than 2^63)");
  }
  const auto kernel = segment_kernel<T, kVec, kPass>;
  const int64_t resident_blocks = static_cast<int64_t>(cuda::sm_count(device.device)) *
                                  cuda::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kSegmentThreads, 0,
                                                               device.device);
  const Walk walk = plan_walk(args, kVec, resident_blocks * kSegmentWarps);

  const size_t key_bytes = aligned_bytes(static_cast<size_t>(args.rows) * sizeof(uint64_t));
  const size_t partial_bytes = aligned_bytes(static_cast<size_t>(2 * walk.ranges * args.features) * sizeof(Acc));
  const size_t sort_bytes = sort_scratch_bytes(args.rows, begin_bit, end_bit);
  char* memory = static_cast<char*>(scratch(2 * key_bytes + partial_bytes + sort_bytes));
  uint64_t* unsorted = reinterpret_cast<uint64_t*>(memory);
  uint64_t* spare = reinterpret_cast<uint64_t*>(memory + key_bytes);
  Acc* partials = reinterpret_cast<Acc*>(memory + 2 * key_bytes);
  void* sort_scratch = memory + 2 * key_bytes + partial_bytes;

  constexpr int kKeyBlocksPerSm = 8;
  keys_kernel<<<cuda::grid_size(args.rows, kThreads, kKeyBlocksPerSm, device), kThreads, 0, stream>>>(
      args.index, args.rows, args.sources, keys, unsorted);
  const uint64_t* sorted = sort_keys(device, unsorted, spare, args.rows, begin_bit, end_bit, sort_scratch, sort_bytes);
  const int64_t block_ranges = (walk.ranges + kSegmentWarps - 1) / kSegmentWarps;
  kernel<<<static_cast<unsigned>(std::min(block_ranges, resident_blocks)), kSegmentThreads, 0, stream>>>(
      args, sorted, keys, walk, partials);
  constexpr int kJoinBlocksPerSm = 8;
  join_kernel<T><<<cuda::grid_size(walk.ranges, kWarps, kJoinBlocksPerSm, device), kThreads, 0, stream>>>(
      args, sorted, keys, walk, partials);
}

}  // namespace

void index_mul(const Cuda& device, Pass pass, const Args& args, const Scratch& scratch) {
  if (args.rows == 0 || args.features == 0) return;  // grad_in1 stays as the caller zeroed it
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
    const auto run = [&](auto vec) {
      constexpr int kWidth = decltype(vec)::value;
      switch (pass) {
        case Pass::kForward: forward<T, kWidth>(device, args); break;
        case Pass::kBackward: backward<T, kWidth, Pass::kBackward>(device, args, scratch); break;
        case Pass::kDoubleBackward: backward<T, kWidth, Pass::kDoubleBackward>(device, args, scratch); break;
      }
    };
    if (aligned) {
      run(std::integral_constant<int, kVec>{});
    } else {
      run(std::integral_constant<int, 1>{});
    }
  });
  cuda::check_launch("index_mul_2d");
}

}  // namespace apex::index_mul_2d
