// fused_rotary_positional_embedding: the CUDA kernel. Blocks loop over tokens ([h, d] slabs); for
// each, the block first puts the token's cos/sin in shared memory (computed once for all its heads:
// the sincos of the angles is the kernel's only real arithmetic), then each thread rotates one unit
// of kVec pairs (two 16-byte vectors in, two out) or copies one vector of the pass-through dims.
#include <algorithm>

#include "apex/cuda.cuh"
#include "fused_rope.h"
#include "rope_math.h"

namespace apex::fused_rope {
namespace {

constexpr int kMaxThreads = 256;
// At least two warps per block (one ROCm wavefront) even for tokens with little work.
constexpr int kMinThreads = 64;
// cos and sin (floats) of at most this many rotated dims fit the default 48 KB of shared memory.
constexpr int64_t kMaxRotatedDims = 6144;

template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void load(const T* x, int64_t e, int64_t stride_d, float (&v)[kVec]) {
  if constexpr (kVec == 1) {
    v[0] = static_cast<float>(x[e * stride_d]);
  } else {
    const AlignedVector<T, kVec> packed = load_vector<kVec>(x, e);  // the vector path has stride_d == 1
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = static_cast<float>(packed.value[k]);
  }
}

template <class T, int kVec>
C10_DEVICE C10_ALWAYS_INLINE void store(T* out, int64_t e, const float (&v)[kVec]) {
  AlignedVector<T, kVec> packed;
#pragma unroll
  for (int k = 0; k < kVec; ++k) packed.value[k] = static_cast<T>(v[k]);
  store_vector<kVec>(out, e, packed);
}

template <class T, int kVec>
__global__ void __launch_bounds__(kMaxThreads) rope_kernel(RopeArgs a) {
  extern __shared__ float angles[];  // cos of the rotated dims, then their sin
  const int64_t rotated = a.sections * a.width, half = a.width / 2;
  float* cos = angles;
  float* sin = angles + rotated;
  // Work units per head: kVec pairs each, then kVec pass-through dims each.
  const int64_t units_per_section = half / kVec, rotate_units = a.sections * units_per_section;
  const int64_t units = rotate_units + (a.dim - rotated) / kVec;
  const int64_t tokens = a.outer0 * a.outer1;
  for (int64_t token = blockIdx.x; token < tokens; token += gridDim.x) {
    const int64_t i0 = token / a.outer1, i1 = token - i0 * a.outer1;
    const TokenPositions where = token_positions(a, i0, i1);
    for (int64_t j = threadIdx.x; j < rotated; j += blockDim.x) {
      const int s = static_cast<int>(j / a.width);
      float c = 1.0f, sn = 0.0f;  // no position: the identity rotation (an exact copy)
      if (where.valid) {
        CUDA_KERNEL_ASSERT(where.pos[s] >= 0 && where.pos[s] < a.tables[s].rows && "RoPE position outside the table");
        cos_sin<T>(a.tables[s], where.pos[s], j - s * a.width, c, sn);
      }
      cos[j] = c;
      sin[j] = sn;
    }
    __syncthreads();
    const T* x = static_cast<const T*>(a.x) + i0 * a.x_stride0 + i1 * a.x_stride1;
    T* out = static_cast<T*>(a.out) + i0 * a.out_stride0 + i1 * a.out_stride1;
    for (int64_t u = threadIdx.x; u < a.heads * units; u += blockDim.x) {
      const int64_t h = u / units, k = u - h * units;
      const T* xh = x + h * a.x_stride_h;
      T* oh = out + h * a.out_stride_h;
      if (k >= rotate_units) {  // pass-through dims
        const int64_t e = rotated + (k - rotate_units) * kVec;
        float v[kVec];
        load<T, kVec>(xh, e, a.x_stride_d, v);
        store<T, kVec>(oh, e, v);
        continue;
      }
      // The unit's two vectors: the q-th of each half of its section (half-split), or the q-th pair
      // of adjacent vectors (interleaved), so both are whole 16-byte vectors either way.
      const int64_t s = k / units_per_section, q = k - s * units_per_section;
      const int64_t ea = s * a.width + (a.interleaved ? 2 * q * kVec : q * kVec);
      const int64_t eb = a.interleaved ? ea + kVec : ea + half;
      float va[kVec], vb[kVec], oa[kVec], ob[kVec];
      load<T, kVec>(xh, ea, a.x_stride_d, va);
      load<T, kVec>(xh, eb, a.x_stride_d, vb);
      if (!a.interleaved) {
#pragma unroll
        for (int m = 0; m < kVec; ++m) {
          rotate_pair<T>(va[m], vb[m], cos[ea + m], sin[ea + m], cos[eb + m], sin[eb + m], a.backward, oa[m], ob[m]);
        }
      } else {
        // Pairs (2m, 2m + 1) of the 2 * kVec consecutive dims va ++ vb.
        float w[2 * kVec], o[2 * kVec];
#pragma unroll
        for (int m = 0; m < kVec; ++m) {
          w[m] = va[m];
          w[kVec + m] = vb[m];
        }
#pragma unroll
        for (int m = 0; m < kVec; ++m) {
          const int64_t p = ea + 2 * m;
          rotate_pair<T>(w[2 * m], w[2 * m + 1], cos[p], sin[p], cos[p + 1], sin[p + 1], a.backward, o[2 * m],
                         o[2 * m + 1]);
        }
#pragma unroll
        for (int m = 0; m < kVec; ++m) {
          oa[m] = o[m];
          ob[m] = o[kVec + m];
        }
      }
      store<T, kVec>(oh, ea, oa);
      store<T, kVec>(oh, eb, ob);
    }
    __syncthreads();  // the next token's angles overwrite these
  }
}

// Whether every access of the kVec-wide path is a whole aligned 16-byte vector.
template <int kVec>
bool vector_path(const RopeArgs& a) {
  const int64_t rotated = a.sections * a.width;
  if (a.x_stride_d != 1 || (a.width / 2) % kVec != 0 || (a.dim - rotated) % kVec != 0) return false;
  for (const int64_t stride : {a.x_stride0, a.x_stride1, a.x_stride_h, a.out_stride0, a.out_stride1, a.out_stride_h}) {
    if (stride % kVec != 0) return false;
  }
  return is_aligned(a.x) && is_aligned(a.out);
}

template <class T, int kVec>
void launch_rope(const RopeArgs& a, int64_t tokens, const Cuda& device) {
  const int64_t units = a.heads * ((a.sections * a.width / 2 + a.dim - a.sections * a.width) / kVec);
  int threads = kMinThreads;
  while (threads < kMaxThreads && threads < units) threads *= 2;
  const size_t smem = 2 * sizeof(float) * a.sections * a.width;
  int resident = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, rope_kernel<T, kVec>, threads, smem) != cudaSuccess) {
    cudaGetLastError();
    resident = 1;
  }
  const unsigned blocks = cuda::grid_size(tokens, 1, std::max(resident, 1), device);
  rope_kernel<T, kVec><<<blocks, threads, smem, cuda::stream(device)>>>(a);
}

}  // namespace

void rope(const Cuda& device, const RopeArgs& args) {
  const int64_t tokens = args.outer0 * args.outer1;
  if (tokens == 0 || args.heads == 0 || args.dim == 0) return;
  if (args.sections * args.width > kMaxRotatedDims) {
    throw std::invalid_argument("fused_rope: at most " + std::to_string(kMaxRotatedDims) +
                                " rotated dims per head on CUDA, got " + std::to_string(args.sections * args.width));
  }
  dispatch_floating<false>(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = vector_width<T>();
    if (vector_path<kVec>(args)) {
      launch_rope<T, kVec>(args, tokens, device);
    } else {
      launch_rope<T, 1>(args, tokens, device);
    }
  });
  cuda::check_launch("fused_rope");
}

}  // namespace apex::fused_rope
