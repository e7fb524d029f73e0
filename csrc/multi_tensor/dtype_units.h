// An optimizer step's CUDA kernels spread over translation units by the dtype of one of its lists, so
// that ninja compiles them in parallel: a step instantiates its kernel for every dtype combination of
// its lists, and in one unit SGD's and LAMB's took 11-12 s of one core (issue 11: each op's build
// within 20 s on the 16-core build host).
//
// The step's run_<op> template takes a filter of that list's dtype: AllDtypes runs every dtype (the
// CPU kernels, LARS), OnlyDtype<T> instantiates only the kernels for T. The op's CUDA function
// (<op>_cuda.cu) dispatches on the list's dtype to run_<op><Engine, OnlyDtype<T>>, instantiating the
// float32 one itself; the others are instantiated by <op>_cuda_<dtype>.cu, one unit each, and declared
// `extern template` in <op>_cuda.cu, which therefore does not compile them again. The list is one
// whose dtype is in every kernel's type list (SGD: the grads; LAMB: the params), so that no kernel is
// compiled by two units.
#pragma once

#include <type_traits>

namespace apex::multi_tensor {

struct AllDtypes {
  template <class T>
  static constexpr bool kRuns = true;
};

template <class Only>
struct OnlyDtype {
  template <class T>
  static constexpr bool kRuns = std::is_same_v<T, Only>;
};

}  // namespace apex::multi_tensor
