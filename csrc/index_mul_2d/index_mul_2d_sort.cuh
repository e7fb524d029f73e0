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

}  // namespace apex::index_mul_2d
