// fused_rotary_positional_embedding: the CPU kernel. Tokens are split over torch's threads; each
// token's cos/sin are looked up (or computed) once for all its heads, and each head is converted to
// float, rotated with ATen's Vectorized math (half-split pairs are two contiguous runs) and
// converted back.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "apex/check.h"
#include "fused_rope.h"
#include "rope_math.h"

namespace apex::fused_rope {
namespace {

using Vec = at::vec::Vectorized<float>;

// Elements per parallel task.
constexpr int64_t kGrainElements = 32768;

// Vectorized round_to<T>.
template <class T>
Vec round_vec(Vec v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return std::get<0>(at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(v, v)));
  }
}

// Half-split pairs (base + j, base + half + j), j < half, of one section: out from x (floats).
template <class T>
void rotate_half_split(const float* x, const float* cos, const float* sin, float* out, int64_t base, int64_t half,
                       bool backward) {
  int64_t j = 0;
  for (; j + Vec::size() <= half; j += Vec::size()) {
    const int64_t a = base + j, b = base + half + j;
    const Vec xa = Vec::loadu(x + a), xb = Vec::loadu(x + b);
    const Vec ca = Vec::loadu(cos + a), sa = Vec::loadu(sin + a), cb = Vec::loadu(cos + b), sb = Vec::loadu(sin + b);
    if (backward) {
      round_vec<T>(round_vec<T>(xa * ca) + round_vec<T>(xb * sb)).store(out + a);
      round_vec<T>(round_vec<T>(xb * cb) - round_vec<T>(xa * sa)).store(out + b);
    } else {
      round_vec<T>(round_vec<T>(xa * ca) - round_vec<T>(xb * sa)).store(out + a);
      round_vec<T>(round_vec<T>(xb * cb) + round_vec<T>(xa * sb)).store(out + b);
    }
  }
  for (; j < half; ++j) {
    const int64_t a = base + j, b = base + half + j;
    rotate_pair<T>(x[a], x[b], cos[a], sin[a], cos[b], sin[b], backward, out[a], out[b]);
  }
}

// cos and sin (rounded to T) of `width` entries of `table` at `pos`. Angles go through ATen's
// vectorized (Sleef) cos/sin, the functions torch.cos/torch.sin use on CPUs, so the composite
// reference on a CPU gets the very same tables.
template <class T>
void fill_table(const Table& table, int64_t pos, int64_t width, float* cos, float* sin) {
  if (table.sin != nullptr) {
    for (int64_t e = 0; e < width; ++e) cos_sin<T>(table, pos, e, cos[e], sin[e]);
    return;
  }
  for (int64_t e = 0; e < width; ++e) cos[e] = table_value<T>(table.cos, table.dtype, pos * table.row_stride + e);
  at::vec::map([](Vec angle) { return angle.sin(); }, sin, cos, width);
  at::vec::map([](Vec angle) { return angle.cos(); }, cos, cos, width);
  for (int64_t e = 0; e < width; ++e) {
    cos[e] = round_to<T>(cos[e]);
    sin[e] = round_to<T>(sin[e]);
  }
}

template <class T>
void rope_tokens(const RopeArgs& a, int64_t begin, int64_t end) {
  const int64_t rotated = a.sections * a.width;
  std::vector<float> cos(rotated), sin(rotated), x(a.dim), out(a.dim);
  for (int64_t token = begin; token < end; ++token) {
    const int64_t i0 = token / a.outer1, i1 = token % a.outer1;
    const TokenPositions where = token_positions(a, i0, i1);
    for (int s = 0; s < a.sections; ++s) {
      const Table& table = a.tables[s];
      if (where.valid) {
        APEX_CHECK(where.pos[s] >= 0 && where.pos[s] < table.rows, "fused_rope: token position ", where.pos[s],
                   " is outside the table's ", table.rows, " positions");
      }
      if (where.valid) {
        fill_table<T>(table, where.pos[s], a.width, cos.data() + s * a.width, sin.data() + s * a.width);
      } else {  // no position: the identity rotation (an exact copy)
        std::fill_n(cos.data() + s * a.width, a.width, 1.0f);
        std::fill_n(sin.data() + s * a.width, a.width, 0.0f);
      }
    }
    const T* x_token = static_cast<const T*>(a.x) + i0 * a.x_stride0 + i1 * a.x_stride1;
    T* out_token = static_cast<T*>(a.out) + i0 * a.out_stride0 + i1 * a.out_stride1;
    for (int64_t h = 0; h < a.heads; ++h) {
      const T* xh = x_token + h * a.x_stride_h;
      if (a.x_stride_d == 1) {
        at::vec::convert(xh, x.data(), a.dim);
      } else {
        for (int64_t e = 0; e < a.dim; ++e) x[e] = static_cast<float>(xh[e * a.x_stride_d]);
      }
      for (int s = 0; s < a.sections; ++s) {
        const int64_t base = s * a.width, half = a.width / 2;
        if (!a.interleaved) {
          rotate_half_split<T>(x.data(), cos.data(), sin.data(), out.data(), base, half, a.backward);
          continue;
        }
        for (int64_t j = 0; j < half; ++j) {
          const int64_t p = base + 2 * j, q = p + 1;
          rotate_pair<T>(x[p], x[q], cos[p], sin[p], cos[q], sin[q], a.backward, out[p], out[q]);
        }
      }
      std::copy(x.begin() + rotated, x.end(), out.begin() + rotated);
      at::vec::convert(out.data(), out_token + h * a.out_stride_h, a.dim);
    }
  }
}

}  // namespace

void rope(const Cpu&, const RopeArgs& args) {
  const int64_t tokens = args.outer0 * args.outer1;
  if (tokens == 0 || args.heads == 0 || args.dim == 0) return;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (args.heads * args.dim));
  dispatch_floating<false>(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    at::parallel_for(0, tokens, grain, [&](int64_t begin, int64_t end) { rope_tokens<T>(args, begin, end); });
  });
}

}  // namespace apex::fused_rope
