#pragma once
// fused_rotary_positional_embedding: how the CUDA kernel splits its work (host and device, no CUDA
// headers, so that a CPU test can compile it with g++ and check that every element is visited once).
//
// A head's dims are cut into units, each handled by one thread for every head of a token:
//   rotated units  kVec pairs: two kVec-wide vectors a (dims ea..) and b (dims eb..); half-split
//                  pairs (ea + p, eb + p) with eb = ea + width / 2, interleaved (ea + 2p, ea + 2p + 1)
//                  with eb = ea + kVec (a and b are then the two halves of 2 * kVec adjacent dims);
//   copied units   kVec pass-through dims ea.. (vector a only).
// A block is cols x rows threads: thread (x, y) takes unit x (then x + cols, ..) of token
// blockIdx.x * rows + y (then + gridDim.x * rows, ..) for the heads of head group blockIdx.y.
#include <c10/macros/Macros.h>

#include <algorithm>
#include <cstdint>

namespace apex::fused_rope {

// Threads per block: 8 warps, so that the kernel's ~128-register threads fit two blocks (16 warps)
// per SM (64K registers); larger blocks would leave a third of the register file idle.
constexpr int kMaxThreads = 256;
// gridDim.y (the head groups) is at most this.
constexpr int64_t kMaxGroups = 65535;

struct Unit {
  int ea, eb;    // first dim of vector a (and of b, rotated units only)
  int section;   // the table (0, or 1 for 2-D RoPE's column half)
  bool rotated;
};

// The units of one head (sizes in dims; the caller checked that they fit in int).
struct UnitMap {
  int vec;                // kVec
  int width;              // rotated dims per section
  int sections;           // 1 or 2
  int units_per_section;  // width / 2 / vec
  int rotate_units;       // sections * units_per_section
  int units;              // rotate_units + (dim - sections * width) / vec
  bool interleaved;
};

inline UnitMap unit_map(int vec, int64_t dim, int64_t width, int sections, bool interleaved) {
  UnitMap m{};
  m.vec = vec;
  m.width = static_cast<int>(width);
  m.sections = sections;
  m.units_per_section = static_cast<int>(width / 2 / vec);
  m.rotate_units = sections * m.units_per_section;
  m.units = m.rotate_units + static_cast<int>((dim - sections * width) / vec);
  m.interleaved = interleaved;
  return m;
}

C10_HOST_DEVICE C10_ALWAYS_INLINE Unit unit_at(const UnitMap& m, int k) {
  if (k >= m.rotate_units) return {m.sections * m.width + (k - m.rotate_units) * m.vec, 0, 0, false};
  const int s = k >= m.units_per_section ? 1 : 0;  // at most 2 sections: no division
  const int q = k - s * m.units_per_section;
  const int ea = s * m.width + (m.interleaved ? 2 * q * m.vec : q * m.vec);
  return {ea, m.interleaved ? ea + m.vec : ea + m.width / 2, s, true};
}

// The dims (a, b) of pair p < vec of a rotated unit: what the kernel's vectors and table reads hold
// (half-split: element p of vectors a and b; interleaved: elements 2p, 2p + 1 of the 2 * vec dims
// from ea). The CPU test checks that these are RoPE's pairs and that every dim is visited once.
C10_HOST_DEVICE C10_ALWAYS_INLINE void pair_dims(const UnitMap& m, const Unit& u, int p, int& da, int& db) {
  da = m.interleaved ? u.ea + 2 * p : u.ea + p;
  db = m.interleaved ? da + 1 : u.eb + p;
}

struct LaunchPlan {
  int cols, rows;       // blockDim.x (units), blockDim.y (tokens)
  unsigned blocks;      // gridDim.x
  int groups;           // gridDim.y: head groups, each of heads_per_group heads (the last may have fewer)
  int heads_per_group;
};

// The block: one thread per unit (up to kMaxThreads), and as many tokens as fill kMaxThreads (no
// more than there are). Idle lanes of a last partial warp cost nothing here: the kernel is bound by
// memory, not by issue slots.
inline LaunchPlan block_shape(int64_t tokens, const UnitMap& m) {
  LaunchPlan p{};
  p.cols = std::min(std::max(m.units, 1), kMaxThreads);
  p.rows = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kMaxThreads / p.cols, tokens)));
  return p;
}

// A token's cos/sin, which every head group of a token computes again, priced in heads' worth of
// rotation work (per unit: kVec sincosf against two vector loads, a rotation and two stores a head).
constexpr int64_t kTableCostHeads = 2;
// The most head groups the many-token grid splits into to even out its waves.
constexpr int64_t kMaxBalanceGroups = 4;

// The grid, for `capacity` resident blocks (SMs x blocks per SM), every block looping over the same
// number of token rows (no last partial wave).
//  - Fewer row blocks than resident blocks (decode-like shapes: a handful of tokens with many heads):
//    the heads are split into groups so the GPU fills; each group recomputes its token's cos/sin,
//    which only few tokens make cheap.
//  - Many tokens: the waves of row blocks rarely divide evenly (391 row blocks on 264 resident
//    slots run as 2 loops of 196 blocks: 74% of the slots busy), so up to kMaxBalanceGroups head
//    groups are weighed, each costing its loops x (its heads + kTableCostHeads), and the cheapest taken.
inline void grid_shape(int64_t tokens, int64_t heads, int64_t capacity, LaunchPlan& p) {
  capacity = std::max<int64_t>(capacity, 1);
  heads = std::max<int64_t>(heads, 1);
  const int64_t row_blocks = (tokens + p.rows - 1) / p.rows;
  const auto loops = [&](int64_t groups) {
    const int64_t cap_x = std::max<int64_t>(1, capacity / groups);
    return (row_blocks + cap_x - 1) / cap_x;
  };
  int64_t groups = 1;
  if (row_blocks < capacity) {
    groups = std::min({heads, capacity / row_blocks, kMaxGroups});
  } else {
    int64_t best_cost = loops(1) * (heads + kTableCostHeads);
    for (int64_t g = 2; g <= std::min({heads, kMaxBalanceGroups, capacity}); ++g) {
      const int64_t cost = loops(g) * ((heads + g - 1) / g + kTableCostHeads);
      if (cost < best_cost) best_cost = cost, groups = g;
    }
  }
  groups = std::max<int64_t>(groups, 1);
  const int64_t per_group = (heads + groups - 1) / groups;
  groups = (heads + per_group - 1) / per_group;  // no empty group
  const int64_t waves = loops(groups);
  p.blocks = static_cast<unsigned>((row_blocks + waves - 1) / waves);
  p.groups = static_cast<int>(groups);
  p.heads_per_group = static_cast<int>(per_group);
}

}  // namespace apex::fused_rope
