// index_mul_2d: the stable radix sort of index_mul_2d_sort.cuh, CUB's (hipCUB's on ROCm). CUB's
// kernels live in a namespace of this op's own, so that they never clash with another library's
// (torch's included) instantiations of the same templates.
#if defined(USE_ROCM)
#include <hipcub/hipcub.hpp>
namespace sorting = hipcub;
#else
#define CUB_WRAPPED_NAMESPACE apex_index_mul_2d_cub
#include <cub/device/device_radix_sort.cuh>
namespace sorting = CUB_NS_QUALIFIER;
#endif

#include "apex/cuda.cuh"
#include "apex/occupancy.cuh"  // cuda::check
#include "index_mul_2d_sort.cuh"

namespace apex::index_mul_2d {

size_t sort_scratch_bytes(int64_t count, int begin_bit, int end_bit) {
  sorting::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  size_t bytes = 0;
  cuda::check(sorting::DeviceRadixSort::SortKeys(nullptr, bytes, keys, count, begin_bit, end_bit),
              "index_mul_2d: sizing the index sort");
  return bytes;
}

uint64_t* sort_keys(const Cuda& device, uint64_t* keys, uint64_t* spare, int64_t count, int begin_bit, int end_bit,
                    void* scratch, size_t scratch_bytes) {
  sorting::DoubleBuffer<uint64_t> buffers(keys, spare);
  cuda::check(sorting::DeviceRadixSort::SortKeys(scratch, scratch_bytes, buffers, count, begin_bit, end_bit,
                                                 cuda::stream(device)),
              "index_mul_2d: sorting the index");
  return buffers.Current();
}

}  // namespace apex::index_mul_2d
