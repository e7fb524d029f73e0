#pragma once
// The boundary between apex/op.h's typed Python entry (templates, in every registration unit) and
// torch's Python bindings (torch/csrc/autograd/python_variable.h, torch/csrc/Exceptions.h). Those
// headers pull in pybind11, whose code (the dispatcher, error translation, internals: ~125 KB of
// .text) GCC generates at -O3 in every unit that includes them, used or not: 4.5-6 s a unit. So
// only these few non-template functions touch them, defined once in python_entry.cpp, which the
// builder compiles once per torch, compiler and flags and links into every op library
// (apex/op_builder/python_entry.py).
//
// Hidden: each op library keeps its own copy, so libraries built from different checkouts never
// bind to one another's.

#include <Python.h>

namespace at {
class Tensor;
}

namespace apex::detail::python {

#define APEX_PYTHON_ENTRY_API __attribute__((visibility("hidden")))

// The tensor of a torch.Tensor (or subclass) object, alive as long as the object; nullptr if `obj`
// is not one. Raises nothing.
APEX_PYTHON_ENTRY_API const at::Tensor* tensor_of(PyObject* obj);

// A new reference to the Python tensor of `tensor` (THPVariable_Wrap): nullptr with a Python error set
// on failure.
APEX_PYTHON_ENTRY_API PyObject* wrap(at::Tensor&& tensor);

// body(context) run as torch's bindings run their bodies (HANDLE_TH_ERRORS): warnings issued meanwhile
// (TORCH_WARN) surface as Python warnings when it returns, and a C++ exception becomes the Python
// exception torch's bindings raise for it (c10::ValueError: ValueError, c10::python_error: the error
// it holds, ...), with nullptr returned.
APEX_PYTHON_ENTRY_API PyObject* run_handled(PyObject* (*body)(void*), void* context);

#undef APEX_PYTHON_ENTRY_API

}  // namespace apex::detail::python
