// apex's `tensor_lists` argument (a list or tuple of lists of tensors) as the amp_C functions
// receive it from Python, converted without touching a reference count per tensor.
//
// Why: pybind11's generic conversion copies every at::Tensor into a std::vector, an atomic
// increment and later decrement per tensor; measured 45 ns a tensor (52 us for the 1156 tensors
// of a 289-param Adam step), all of it host time before the kernel starts. Here the tensors are
// borrowed from their Python objects (c10::MaybeOwnedTraits, as torch's own MaybeOwned does):
// the Python sequences are held for the call, and the GIL is held throughout it.
#pragma once

#include <torch/extension.h>

#include <vector>

namespace apex::multi_tensor {

class TensorListsArg {
 public:
  TensorListsArg() = default;
  TensorListsArg(const TensorListsArg&) = delete;
  TensorListsArg& operator=(const TensorListsArg&) = delete;
  TensorListsArg(TensorListsArg&&) = default;
  TensorListsArg& operator=(TensorListsArg&&) = default;
  ~TensorListsArg() { release(); }

  size_t size() const { return lists_.size(); }
  at::TensorList operator[](size_t i) const { return lists_[i]; }

  // Borrows the tensors of `src`; false (nothing held) unless it is a sequence of sequences
  // (not tensors) of tensors.
  bool load(pybind11::handle src) {
    release();
    auto outer = pybind11::reinterpret_steal<pybind11::object>(PySequence_Fast(src.ptr(), ""));
    if (!outer) return reject();
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(outer.ptr());
    PyObject** items = PySequence_Fast_ITEMS(outer.ptr());
    lists_.resize(count);
    for (Py_ssize_t l = 0; l < count; ++l) {
      // A tensor is iterable too: taken as a list it would be one 0-dim tensor per element.
      if (THPVariable_Check(items[l])) return reject();
      auto inner = pybind11::reinterpret_steal<pybind11::object>(PySequence_Fast(items[l], ""));
      if (!inner) return reject();
      const Py_ssize_t size = PySequence_Fast_GET_SIZE(inner.ptr());
      PyObject** tensors = PySequence_Fast_ITEMS(inner.ptr());
      lists_[l].reserve(size);
      for (Py_ssize_t t = 0; t < size; ++t) {
        if (!THPVariable_Check(tensors[t])) return reject();
        lists_[l].push_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(THPVariable_Unpack(tensors[t])));
      }
      sequences_.push_back(std::move(inner));
    }
    sequences_.push_back(std::move(outer));
    return true;
  }

 private:
  // Not a tensor_lists argument: drop what was borrowed and the error PySequence_Fast may have set.
  bool reject() {
    PyErr_Clear();
    release();
    return false;
  }

  void release() {
    for (auto& list : lists_) {
      for (auto& tensor : list) c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(tensor);
    }
    lists_.clear();
    sequences_.clear();
  }

  std::vector<std::vector<at::Tensor>> lists_;   // borrowed: no reference of their own
  std::vector<pybind11::object> sequences_;      // the Python sequences that own them
};

}  // namespace apex::multi_tensor

namespace pybind11::detail {

template <>
struct type_caster<apex::multi_tensor::TensorListsArg> {
  PYBIND11_TYPE_CASTER(apex::multi_tensor::TensorListsArg, const_name("list[list[torch.Tensor]]"));
  bool load(handle src, bool /*convert*/) { return value.load(src); }
};

}  // namespace pybind11::detail
