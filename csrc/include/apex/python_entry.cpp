// The only unit of an op library that includes torch's Python bindings (see python_entry.h). It is
// not an op's source: apex/op_builder/python_entry.py compiles it once and links the object into
// every op library.
#include "apex/python_entry.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <utility>

namespace apex::detail::python {

const at::Tensor* tensor_of(PyObject* obj) {
  return THPVariable_Check(obj) ? &THPVariable_Unpack(obj) : nullptr;
}

PyObject* wrap(at::Tensor&& tensor) { return THPVariable_Wrap(std::move(tensor)); }

PyObject* run_handled(PyObject* (*body)(void*), void* context) {
  HANDLE_TH_ERRORS
  return body(context);
  END_HANDLE_TH_ERRORS
}

}  // namespace apex::detail::python
