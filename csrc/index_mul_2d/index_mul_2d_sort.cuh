#pragma once
// The stable radix sort the backward passes of index_mul_2d_cuda.cu order the index with
// (index_mul_2d_sort.cu): CUB's, in a translation unit of its own, as its templates take longer to
// compile than every kernel of the op together, and ninja compiles the two files side by side.
#include <cstddef>
#include <cstdint>

#include "apex/device.h"

namespace apex::index_mul_2d {

// Scratch bytes sort_keys needs for `count` keys sorted on bits [begin_bit, end_bit).
size_t sort_scratch_bytes(int64_t count, int begin_bit, int end_bit);

// Sorts keys[0, count) by their bits [begin_bit, end_bit), stably (equal bits keep their order), on
// the device's stream, using `spare` (count keys) and `scratch` (sort_scratch_bytes). Returns where
// the sorted keys are: keys or spare.
uint64_t* sort_keys(const Cuda& device, uint64_t* keys, uint64_t* spare, int64_t count, int begin_bit, int end_bit,
                    void* scratch, size_t scratch_bytes);

// APEX_INDEX_MUL_VARIANT=keys16 (gpu_ab/index_mul/README.md): the same stable order for fewer than
// 2^16 sources and 2^32 rows, as 16-bit sources (the keys, bits [0, end_bit)) carrying 32-bit rows
// (the values): 6 bytes an item per radix pass where the 64-bit keys move 8, and a quarter of the
// histogram pass's reads. Returns where the sorted pairs are (each buffer pair's current half).
struct SortedPairs {
  uint16_t* sources;
  uint32_t* rows;
};
size_t sort_pairs16_scratch_bytes(int64_t count, int end_bit);
SortedPairs sort_pairs16(const Cuda& device, SortedPairs pairs, SortedPairs spare, int64_t count, int end_bit,
                         void* scratch, size_t scratch_bytes);

}  // namespace apex::index_mul_2d
