// transducer: the loss's CUDA kernels (row terms, alpha/beta wavefronts, gradient) and their
// launches; the plan is in transducer_cuda.cuh.
#include "transducer_cuda.cuh"

namespace apex::transducer {
namespace {

// ---- loss ----------------------------------------------------------------------------------

constexpr int kRowUnroll = 4;          // 16-byte loads in flight per thread over a logits row
constexpr int kMinRowThreads = 64;
constexpr int kMaxRowThreads = 256;
constexpr int kMaxWavefrontThreads = 1024;

// Rows of up to kMaxGroupRowBytes go to groups of lanes (loss_rows_group_kernel): each lane issues
// kRowPacks 16-byte loads of its row before it uses any (a 2 KB row, V = 1024 fp16, is 16 lanes'
// one round trip), and a group merges its statistics by shuffles: no shared memory, no barrier.
// Longer rows take a block each (loss_rows_kernel), many threads on one row.
constexpr int kRowPacks = 8;
constexpr int64_t kMaxGroupRowBytes = 16 * 1024;

// Lanes per row: the power of two that covers a row's vectors at kRowPacks a lane, at most a warp
// (longer rows loop, kRowPacks vectors a lane per pass). Shorter rows share a warp.
int row_group_lanes(int64_t classes, int vec) {
  const int64_t packs = (classes + vec - 1) / vec;
  int lanes = 1;
  while (lanes < kPlanWarp && static_cast<int64_t>(lanes) * kRowPacks < packs) lanes *= 2;
  return lanes;
}


// Whether cell c has a label transition (u < u_len - 1).
C10_DEVICE C10_ALWAYS_INLINE bool has_label(const Lattice& l, const Cell& c) {
  return c.valid && c.u + 1 < l.u_len[c.b];
}

// A row's log-sum-exp, and log-probabilities of blank and label (rounded to T: what NVIDIA apex's
// log_softmax in x's dtype gives); 0 for rows outside the lengths, and for a label where none is.
template <class T>
C10_DEVICE C10_ALWAYS_INLINE void write_row_terms(const LossArgs& a, bool valid, bool labelled, int64_t row, float lse,
                                                  float blank, float label) {
  const auto logp = [&](float logit) { return static_cast<float>(static_cast<T>(logit - lse)); };
  a.lse[row] = valid ? lse : 0.0f;
  a.blank_logp[row] = valid ? logp(blank) : 0.0f;
  a.label_logp[row] = labelled ? logp(label) : 0.0f;
}

// Rows of the lattice by groups of `lanes` lanes (a power of two dividing the warp; warp / lanes rows
// per warp at once). A row splits as 16-byte accesses see it (RowSplit: scalars before the first
// aligned vector and after the last, for odd V or a misaligned tensor): its vectors go round the
// group's lanes, kRowPacks a lane per pass, all loaded before any is used; then its scalars. Each
// lane keeps a running max and sum of exp(x - max), which the group merges by shuffles. Every lane
// of a warp reaches the shuffles: rows past the end or outside the lengths take part with nothing.
template <class T, int kVec>
__global__ void __launch_bounds__(kThreads) loss_rows_group_kernel(LossArgs a, int lanes) {
  using Acc = acc_type<T>;
  const T* x = static_cast<const T*>(a.x);
  const Lattice& l = a.lattice;
  const int lane = static_cast<int>(threadIdx.x) % C10_WARP_SIZE, member = lane % lanes;
  const int64_t rows_per_warp = C10_WARP_SIZE / lanes, warps_per_block = blockDim.x / C10_WARP_SIZE;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / C10_WARP_SIZE;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps_per_block * rows_per_warp;
  for (int64_t first = warp * rows_per_warp; first < l.rows; first += step) {
    const int64_t row = first + lane / lanes;
    const Cell c = row < l.rows ? cell_of(l, row) : Cell{0, 0, 0, false};
    const T* logits = x + (c.valid ? row : 0) * a.classes;
    const RowSplit split = c.valid ? split_row<T, kVec>(logits, a.classes) : RowSplit{0, 0, kVec};
    const T* body = logits + split.head;
    // The blank's logit and the label's class, loaded by the lane that writes, alongside the vectors.
    float blank = 0.0f, label = 0.0f;
    int64_t label_class = 0;
    const bool labelled = has_label(l, c);
    if (member == 0 && c.valid) blank = static_cast<float>(logits[a.blank]);
    if (member == 0 && labelled) label_class = a.labels[c.b * a.label_stride + c.u];
    Acc max = kNegInf<Acc>, sum = Acc(0);
    for (int64_t p0 = 0; p0 < split.packs; p0 += static_cast<int64_t>(kRowPacks) * lanes) {
      AlignedVector<T, kVec> v[kRowPacks];
#pragma unroll
      for (int i = 0; i < kRowPacks; ++i) {
        const int64_t p = p0 + static_cast<int64_t>(i) * lanes + member;
        if (p < split.packs) v[i] = load_vector<kVec>(body, p * kVec);
      }
      // Vector by vector (only its kVec values converted at a time): raise the running max to the
      // vector's, rescaling the sum taken at the old one (rarely, after a row's first vectors; 0
      // while the old max was -inf), then add its exps.
#pragma unroll
      for (int i = 0; i < kRowPacks; ++i) {
        if (p0 + static_cast<int64_t>(i) * lanes + member >= split.packs) continue;
        Acc values[kVec];
        convert(v[i], values);
        Acc vector_max = kNegInf<Acc>;
#pragma unroll
        for (int e = 0; e < kVec; ++e) vector_max = max_of(vector_max, values[e]);
        if (vector_max > max) {
          sum *= fast_exp2((max - vector_max) * kLog2e<Acc>);
          max = vector_max;
        }
        const Acc base = max == kNegInf<Acc> ? Acc(0) : max * kLog2e<Acc>;  // -inf logits add exp2(-inf) = 0
#pragma unroll
        for (int e = 0; e < kVec; ++e) sum += fast_exp2(values[e] * kLog2e<Acc> - base);
      }
    }
    // The head and tail scalars (fewer than kVec each), round the group's lanes.
    const int64_t scalars = c.valid ? split.head + (a.classes - split.tail()) : 0;
    for (int64_t q = member; q < scalars; q += lanes) {
      const Acc value = static_cast<Acc>(logits[q < split.head ? q : split.tail() + (q - split.head)]);
      if (value > max) {
        sum *= fast_exp2((max - value) * kLog2e<Acc>);
        max = value;
      }
      sum += fast_exp2(value * kLog2e<Acc> - (max == kNegInf<Acc> ? Acc(0) : max * kLog2e<Acc>));
    }
    if (member == 0 && labelled) label = static_cast<float>(logits[label_class]);  // an L1 hit: the row was just read
    const Acc row_max = group_reduce(max, lanes, [](Acc p, Acc q) { return max_of(p, q); });
    // Each lane's sum at the row's max (equal maxima, -inf ones included, need no exp).
    if (max != row_max) sum *= fast_exp2((max - row_max) * kLog2e<Acc>);
    const Acc row_sum = group_reduce(sum, lanes, [](Acc p, Acc q) { return p + q; });
    if (member == 0 && row < l.rows) {
      write_row_terms<T>(a, c.valid, labelled, row, static_cast<float>(row_max + log(row_sum)), blank, label);
    }
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads) loss_rows_kernel(LossArgs a) {
  __shared__ Online<acc_type<T>> scratch[kMaxRowThreads / C10_WARP_SIZE];
  const T* x = static_cast<const T*>(a.x);
  const Lattice& l = a.lattice;
  for (int64_t row = blockIdx.x; row < l.rows; row += gridDim.x) {
    const Cell c = cell_of(l, row);
    if (!c.valid) {  // block-uniform: the row is never read
      if (threadIdx.x == 0) write_row_terms<T>(a, false, false, row, 0.0f, 0.0f, 0.0f);
      continue;
    }
    const T* logits = x + row * a.classes;
    const Online<acc_type<T>> state = row_statistics<kRowUnroll, kVec>(logits, a.classes, scratch);
    if (threadIdx.x == 0) {
      const bool labelled = has_label(l, c);
      const float label = labelled ? static_cast<float>(logits[a.labels[c.b * a.label_stride + c.u]]) : 0.0f;
      write_row_terms<T>(a, true, labelled, row, static_cast<float>(state.log_sum_exp()),
                         static_cast<float>(logits[a.blank]), label);
    }
  }
}

// alpha or beta of batch b by global memory alone, any u_len (blockDim.x threads over each diagonal).
C10_DEVICE void wavefront_any(const LossArgs& a, int64_t b, bool forward, float* values) {
  const Lattice& l = a.lattice;
  const int64_t t_len = l.t_len[b], u_len = l.u_len[b];
  for (int64_t step = 0; step < t_len + u_len - 1; ++step) {
    const int64_t d = forward ? step : t_len + u_len - 2 - step;
    for (int64_t u = threadIdx.x; u < u_len; u += blockDim.x) {
      const int64_t t = d - u;
      if (t < 0 || t >= t_len) continue;
      values[t * l.max_u + u] = forward ? alpha_at(a, b, t, u) : beta_at(a, b, t, u);
    }
    __syncthreads();  // the next diagonal reads this one
  }
}

// Diagonals ahead whose log-probabilities a wavefront thread holds (loads in flight meanwhile).
constexpr int kAhead = 3;

// alpha (blockIdx.y == 0) or beta (1) of batch blockIdx.x, over anti-diagonals t + u = d; the beta
// block also writes the loss. With u_len <= blockDim.x (the launch covers max_u up to
// kMaxWavefrontThreads), thread u owns the cell (d - u, u) of every diagonal: its own previous value
// stays in a register, its neighbour's (u - 1 for alpha, u + 1 for beta) comes from the previous
// diagonal in shared memory, and the two log-probabilities a cell adds are loaded kAhead diagonals
// early. No global load waits inside the recursion; alpha and beta are written as they go.
template <class T>
__global__ void __launch_bounds__(kMaxWavefrontThreads) wavefront_kernel(LossArgs a) {
  __shared__ float diagonal[2][kMaxWavefrontThreads];
  const Lattice& l = a.lattice;
  const int64_t b = blockIdx.x, t_len = l.t_len[b], u_len = l.u_len[b];
  const bool forward = blockIdx.y == 0;
  float* values = (forward ? a.alpha : a.beta) + b * l.max_t * l.max_u;
  if (u_len > static_cast<int64_t>(blockDim.x)) {  // block-uniform
    wavefront_any(a, b, forward, values);
    if (!forward && threadIdx.x == 0) static_cast<T*>(a.loss)[b] = static_cast<T>(t_len > 0 ? -values[0] : 0.0f);
    return;
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t u = threadIdx.x, steps = t_len + u_len - 1;
  const bool packed = l.batch_offset != nullptr;
  // Row (t, u) of batch b is first + t * per_t + u (row_of).
  const int64_t first = packed ? batch_start(l, b) : b * l.max_t * l.max_u, per_t = packed ? u_len : l.max_u;
  // The log-probabilities the cell of step s adds: alpha(t, u), t = s - u: blank of (t - 1, u) and
  // label of (t, u - 1); beta(t, u), t = steps - 1 - s - u: blank and label of (t, u).
  const auto fetch = [&](int64_t s, float& blank, float& label) {
    const int64_t t = (forward ? s : steps - 1 - s) - u;
    if (s >= steps || u >= u_len || t < 0 || t >= t_len) return;
    if (forward) {
      if (t > 0) blank = a.blank_logp[first + (t - 1) * per_t + u];
      if (u > 0) label = a.label_logp[first + t * per_t + u - 1];
    } else {
      blank = a.blank_logp[first + t * per_t + u];
      if (u + 1 < u_len) label = a.label_logp[first + t * per_t + u];
    }
  };
  float blank[kAhead + 1] = {}, label[kAhead + 1] = {};  // [i]: step s + i's
#pragma unroll
  for (int i = 0; i < kAhead; ++i) fetch(i, blank[i], label[i]);
  float mine = neg_inf;  // this thread's value on the previous diagonal
  for (int64_t s = 0; s < steps; ++s) {
    fetch(s + kAhead, blank[kAhead], label[kAhead]);
    const int64_t t = (forward ? s : steps - 1 - s) - u;
    if (u < u_len && t >= 0 && t < t_len) {
      const float* previous = diagonal[(s + 1) & 1];
      float value;
      if (forward) {
        value = t == 0 && u == 0 ? 0.0f
                                 : log_add_exp(t > 0 ? mine + blank[0] : neg_inf,
                                                    u > 0 ? previous[u - 1] + label[0] : neg_inf);
      } else {
        value = t == t_len - 1 && u == u_len - 1
                    ? blank[0]
                    : log_add_exp(t + 1 < t_len ? mine + blank[0] : neg_inf,
                                       u + 1 < u_len ? previous[u + 1] + label[0] : neg_inf);
      }
      mine = value;
      diagonal[s & 1][u] = value;
      values[t * l.max_u + u] = value;
    }
#pragma unroll
    for (int i = 0; i < kAhead; ++i) blank[i] = blank[i + 1], label[i] = label[i + 1];
    __syncthreads();  // the next diagonal reads this one; the one before is read by no one now
  }
  if (!forward && threadIdx.x == 0) {  // thread 0 computed beta(0, 0) last
    static_cast<T*>(a.loss)[b] = static_cast<T>(t_len > 0 && u_len > 0 ? -mine : 0.0f);
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kMaxRowThreads) loss_grad_kernel(LossBackwardArgs args) {
  const LossArgs& a = args.forward;
  const T* x = static_cast<const T*>(a.x);
  T* grad = static_cast<T*>(args.grad);
  const Lattice& l = a.lattice;
  for (int64_t row = blockIdx.x; row < l.rows; row += gridDim.x) {
    const Cell c = cell_of(l, row);
    T* out = grad + row * a.classes;
    if (!c.valid) {
      zero_row<kVec>(out, a.classes);
      continue;
    }
    const T* logits = x + row * a.classes;
    const float g = args.grad_loss[c.b];
    const CellGrad terms = cell_grad(a, c.b, c.t, c.u);
    const float scale = args.fused_softmax ? g * terms.occupancy : 0.0f;
    const float lse = a.lse[row];
    const RowSplit split = write_scaled_softmax<kRowUnroll, kVec>(logits, out, a.classes, lse, scale, 0.0f);
    // The blank's and the label's elements, rewritten by the threads that wrote them.
    const int64_t label = c.u + 1 < l.u_len[c.b] ? a.labels[c.b * a.label_stride + c.u] : -1;
    for (const int64_t v : {a.blank, label}) {
      if (v < 0 || threadIdx.x != split.owner(v) || (v == label && label == a.blank)) continue;
      const float p = expf(static_cast<float>(logits[v]) - lse);
      const float through = (v == a.blank ? terms.through_blank : 0.0f) + (v == label ? terms.through_label : 0.0f);
      out[v] = static_cast<T>(scale * p - g * through);
    }
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, std::numeric_limits<int32_t>::max())));
}

}  // namespace

void loss_forward(const Cuda& device, const LossArgs& a) {
  const Lattice& l = a.lattice;
  if (l.batch == 0) return;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const cudaStream_t stream = cuda::stream(device);
    if (l.rows > 0 && a.classes > 0 && a.classes * static_cast<int64_t>(sizeof(T)) <= kMaxGroupRowBytes) {
      // Any alignment: a row's misaligned ends are its scalars.
      constexpr int kVec = vector_width<T>();
      const int lanes = row_group_lanes(a.classes, kVec);
      const auto kernel = loss_rows_group_kernel<T, kVec>;
      const int64_t rows_per_block = kThreads / lanes;
      const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, 0, device.device);
      const int64_t resident = static_cast<int64_t>(sm_count(device.device)) * per_sm;  // one wave, rows in a loop
      const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((l.rows + rows_per_block - 1) / rows_per_block, 1,
                                                                    std::max<int64_t>(resident, 1)));
      kernel<<<blocks, kThreads, 0, stream>>>(a, lanes);
    } else if (l.rows > 0 && a.classes > 0) {  // any alignment too (row_statistics' RowSplit)
      const unsigned threads = row_threads<T>(a.classes, kRowUnroll, kMinRowThreads, kMaxRowThreads);
      loss_rows_kernel<T, vector_width<T>()><<<row_blocks(l.rows), threads, 0, stream>>>(a);
    }
    // A thread per u of a diagonal, in whole wavefronts (64 covers CUDA warps and ROCm wavefronts);
    // max_u past kMaxWavefrontThreads loops over u (wavefront_any).
    constexpr int64_t kLanes = 64;
    const unsigned threads = static_cast<unsigned>(
        std::min<int64_t>(kMaxWavefrontThreads, std::max<int64_t>(kLanes, (l.max_u + kLanes - 1) / kLanes * kLanes)));
    wavefront_kernel<T><<<dim3(static_cast<unsigned>(l.batch), 2), threads, 0, stream>>>(a);
  });
  check_launch("transducer_loss_forward");
}

void loss_backward(const Cuda& device, const LossBackwardArgs& args) {
  const LossArgs& a = args.forward;
  if (a.lattice.rows == 0 || a.classes == 0) return;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const unsigned threads = row_threads<T>(a.classes, kRowUnroll, kMinRowThreads, kMaxRowThreads);
    with_vector_width<T>(a.classes, {a.x, args.grad}, [&](auto width) {
      loss_grad_kernel<T, decltype(width)::value>
          <<<row_blocks(a.lattice.rows), threads, 0, cuda::stream(device)>>>(args);
    });
  });
  check_launch("transducer_loss_backward");
}

}  // namespace apex::transducer
