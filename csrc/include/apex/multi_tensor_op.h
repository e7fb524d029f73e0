// Host side of a multi-tensor op function: the tensor lists of a call checked before anything
// runs (the same checks in the Meta kernel, with symbolic sizes under torch.compile), and turned
// into the plain TensorLists the kernels take.
//
//   template <class Device>
//   static void call(int64_t chunk_size, const at::Tensor& flag, at::TensorList grads, at::TensorList params) {
//     Lists lists("my_op", chunk_size, flag, {{grads, "grads"}, {params, "params", Access::kReadWrite}});
//     launch<Device>(flag, [&](const auto& device) {
//       my_kernel(device, lists.view(), flag_ptr(flag), args);   // real tensors only
//       lists.write_back();
//     });
//   }
//
// Any strides are accepted. Tensor t of every list is paired element by element with tensor t
// of the others in the memory layout of a reference tensor (the first written list's, when it is
// dense); a tensor laid out otherwise (a channels-last grad of a contiguous weight, `g.t()`, a
// non-dense view) is copied into a temporary of the reference layout for the call, and copied
// back if the kernel writes it. Tensors that already match are used in place: no copy per step.
// Tensors of different shapes (same numel) pair up in memory order, as in NVIDIA apex, which is
// only meaningful when both are contiguous, so anything else is refused.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/empty_strided.h>

#include <initializer_list>
#include <utility>
#include <vector>

#include "apex/multi_tensor_kernel.h"
#include "apex/op.h"

namespace apex::multi_tensor {

enum class Access { kRead, kWrite, kReadWrite };

// One Tensor[] argument of a multi-tensor op.
struct ListArg {
  at::TensorList tensors;
  const char* name;
  Access access = Access::kRead;
  bool optional = false;  // may be empty: the call leaves the list out
};

// A scalar tensor argument of a call (lr, step, inv_scale, ...), for Lists::check_scalars.
struct ScalarTensorArg {
  const char* name;
  const at::Tensor& tensor;
  bool per_tensor = false;  // may hold one value per tensor of the call (step counts)
};

inline void check_scalar(const char* op, const char* what, const at::Tensor& x, const at::Tensor& flag,
                         int64_t count = 1);

class Lists {
 public:
  // allow_double: the op computes float64 lists (in double); others take float32, float16 and bfloat16.
  Lists(const char* op, int64_t chunk_size, const at::Tensor& flag, std::vector<ListArg> lists,
        bool allow_double = false)
      : op_(op), chunk_size_(chunk_size), flag_(flag), lists_(std::move(lists)), allow_double_(allow_double) {
    APEX_CHECK(static_cast<int>(lists_.size()) <= kMaxLists, op, ": at most ", kMaxLists, " tensor lists");
    APEX_CHECK(chunk_size > 0, op, ": chunk_size must be positive, got ", chunk_size);
    APEX_CHECK(flag.scalar_type() == at::kInt, op, ": the noop/overflow flag must be an int32 tensor, got ",
               flag.scalar_type());
    APEX_CHECK(flag.sym_numel() >= 1, op, ": the noop/overflow flag must have at least one element");
    const ListArg& first = lists_.front();
    APEX_CHECK(!first.tensors.empty(), op, ": the tensor lists are empty (", first.name, " has no tensors)");
    count_ = static_cast<int64_t>(first.tensors.size());
    // The call's shape (which lists, how many tensors) before its tensors: a list left out is
    // named as such even when the tensors given also sit on the wrong device.
    for (size_t l = 0; l < lists_.size(); ++l) check_list_length(static_cast<int>(l));
    for (size_t l = 0; l < lists_.size(); ++l) check_tensors(static_cast<int>(l));
  }

  const char* op() const { return op_; }
  int64_t count() const { return count_; }
  int depth() const { return static_cast<int>(lists_.size()); }
  bool has(int list) const { return !lists_[list].tensors.empty(); }
  at::TensorList tensors(int list) const { return lists_[list].tensors; }
  at::ScalarType scalar_type(int list) const { return lists_[list].tensors[0].scalar_type(); }
  Dtype dtype(int list) const { return floating_dtype(lists_[list].tensors[0], op_, lists_[list].name); }
  const char* name(int list) const { return lists_[list].name; }

  // check_scalar for each of the call's scalar tensor arguments, in order.
  void check_scalars(std::initializer_list<ScalarTensorArg> scalars) const {
    for (const ScalarTensorArg& s : scalars) check_scalar(op_, s.name, s.tensor, flag_, s.per_tensor ? count_ : 1);
  }

  // Rows of 2-d+ tensors (AdamP's channels) must be contiguous runs in memory: dim 0 outermost.
  void require_rows_outermost() { rows_outermost_ = true; }

  // The kernels' view of the call (inside launch<Device>: real tensors only). Tensors laid out
  // unlike their reference are replaced by temporaries of its layout, filled if the kernel reads them.
  const TensorLists& view() {
    const int depth = this->depth();
    data_.assign(static_cast<size_t>(depth * count_), nullptr);
    numel_.resize(static_cast<size_t>(count_));
    if (rows_outermost_) rows_.resize(static_cast<size_t>(count_));
    for (int64_t t = 0; t < count_; ++t) {
      const at::Tensor* ref = reference(t);
      numel_[t] = lists_[0].tensors[t].numel();
      if (rows_outermost_) rows_[t] = rows_of(lists_[0].tensors[t]);
      for (int l = 0; l < depth; ++l) {
        if (!has(l)) continue;
        const at::Tensor& x = lists_[l].tensors[t];
        data_[l * count_ + t] = matches(x, ref) ? x.data_ptr() : temporary(l, t, x, ref);
      }
    }
    view_.op = op_;
    view_.depth = depth;
    view_.count = count_;
    view_.chunk_size = chunk_size_;
    for (int l = 0; l < depth; ++l) view_.dtypes[l] = has(l) ? dtype(l) : dtype(0);
    view_.data = data_.data();
    view_.numel = numel_.data();
    view_.rows = rows_outermost_ ? rows_.data() : nullptr;
    return view_;
  }

  // After the kernels: the temporaries of written tensors back into them.
  void write_back() {
    for (auto& [list, tensor, temporary] : temporaries_) {
      if (lists_[list].access != Access::kRead) lists_[list].tensors[tensor].copy_(temporary);
    }
    temporaries_.clear();
  }

 private:
  struct Temporary {
    int list;
    int64_t tensor;
    at::Tensor temporary;
  };

  void check_list_length(int l) const {
    const ListArg& list = lists_[l];
    if (list.tensors.empty()) {
      APEX_CHECK(list.optional, op_, ": the tensor lists are empty (", list.name, " has no tensors)");
      return;
    }
    APEX_CHECK(static_cast<int64_t>(list.tensors.size()) == count_, op_, ": tensor list ", l, " (", list.name,
               ") has ", list.tensors.size(), " tensors but list 0 (", lists_[0].name, ") has ", count_);
  }

  void check_tensors(int l) const {
    const ListArg& list = lists_[l];
    const char* op = op_;
    if (list.tensors.empty()) return;  // an optional list left out
    const at::ScalarType dtype = list.tensors[0].defined() ? list.tensors[0].scalar_type() : at::kFloat;
    for (int64_t t = 0; t < count_; ++t) {
      const at::Tensor& x = list.tensors[t];
      APEX_CHECK(x.defined(), op, ": tensor ", t, " of list ", l, " (", list.name, ") is undefined");
      APEX_CHECK(x.layout() == at::kStrided, op, ": tensor ", t, " of list ", l, " (", list.name,
                 ") is sparse (sparse gradients are not supported)");
      APEX_CHECK(x.device() == flag_.device(), op, ": tensor ", t, " of list ", l, " (", list.name, ") is on ",
                 x.device(), " but the flag is on ", flag_.device(),
                 " (all tensors and the flag must share one device)");
      APEX_CHECK(x.scalar_type() == dtype, op, ": every tensor of ", list.name, " must share one dtype (tensor 0 is ",
                 dtype, ", tensor ", t, " is ", x.scalar_type(), ")");
      if (l == 0) continue;
      const at::Tensor& first = lists_[0].tensors[t];
      APEX_CHECK(x.sym_numel() == first.sym_numel(), op, ": tensor ", t, " of list ", l, " (", list.name, ") has ",
                 x.sym_numel(), " elements but list 0 (", lists_[0].name, ") has ", first.sym_numel());
      if (!x.sym_sizes().equals(first.sym_sizes())) {
        APEX_CHECK(x.is_contiguous() && first.is_contiguous(), op, ": tensor ", t, " of list ", l, " (", list.name,
                   ") has shape ", x.sym_sizes(), " but list 0 (", lists_[0].name, ") has shape ", first.sym_sizes(),
                   "; tensors of different shapes pair up element by element in memory order, so both must be "
                   "contiguous");
      }
    }
    floating_dtype(list.tensors[0], op, list.name, allow_double_);
  }

  static bool dense(const at::Tensor& x) { return x.is_non_overlapping_and_dense(); }

  // Rows of a tensor for row-wise kernels: dim 0 of 2-d+ tensors; 0 marks a 0/1-d tensor (one row).
  static int64_t rows_of(const at::Tensor& x) { return x.dim() > 1 ? x.size(0) : 0; }

  // The layout tensor t of every list is computed in: the first written list's tensor if it is
  // dense (and, for row-wise ops, keeps dim 0 outermost), else the first such tensor; none means
  // contiguous.
  const at::Tensor* reference(int64_t t) const {
    const at::Tensor* found = nullptr;
    for (int pass = 0; pass < 2 && found == nullptr; ++pass) {
      for (const ListArg& list : lists_) {
        if (list.tensors.empty() || (pass == 0 && list.access == Access::kRead)) continue;
        const at::Tensor& x = list.tensors[t];
        if (dense(x) && (!rows_outermost_ || x.dim() <= 1 || x.stride(0) * x.size(0) == x.numel())) {
          found = &x;
          break;
        }
      }
    }
    return found;
  }

  static bool matches(const at::Tensor& x, const at::Tensor* ref) {
    if (x.numel() <= 1) return true;  // one element (or none): no layout to agree on
    if (ref == nullptr) return false;
    if (x.sizes().equals(ref->sizes())) return x.strides().equals(ref->strides()) && dense(x);
    return x.is_contiguous() && ref->is_contiguous();  // flat views of one another (checked shapes)
  }

  void* temporary(int l, int64_t t, const at::Tensor& x, const at::Tensor* ref) {
    const ListArg& list = lists_[l];
    if (list.access != Access::kRead) {
      APEX_CHECK(at::has_internal_overlap(x) != at::MemOverlap::Yes, op_, ": tensor ", t, " of list ", l, " (",
                 list.name, ") is written but has elements sharing memory (an expanded tensor)");
    }
    at::Tensor temporary = ref != nullptr ? at::empty_strided(ref->sizes(), ref->strides(), x.options())
                                          : at::empty(x.sizes(), x.options());
    if (list.access != Access::kWrite) temporary.copy_(x);
    temporaries_.push_back({l, t, temporary});
    return temporary.data_ptr();
  }

  const char* op_;
  int64_t chunk_size_;
  const at::Tensor& flag_;
  std::vector<ListArg> lists_;
  bool allow_double_;
  int64_t count_ = 0;
  bool rows_outermost_ = false;
  std::vector<void*> data_;
  std::vector<int64_t> numel_, rows_;
  std::vector<Temporary> temporaries_;
  TensorLists view_;
};

inline int* flag_ptr(const at::Tensor& flag) { return flag.mutable_data_ptr<int>(); }

// A sparse tensor sends a call to the Sparse dispatch keys, where no kernel would be found and the
// dispatcher's message would list backends: say what is wrong instead.
inline void refuse_sparse(const c10::OperatorHandle& op, torch::jit::Stack* /*stack*/) {
  APEX_CHECK(false, op.schema().name(), ": sparse tensors are not supported (sparse gradients are not supported)");
}

// define<Op>(m, Autograd::kNever) (multi-tensor ops are never differentiated), refusing sparse tensors.
template <class Op>
void define_multi_tensor(torch::Library& m) {
  define<Op>(m, Autograd::kNever);
  const std::string name = detail::op_name(Op::kSchema);
  for (const auto key : {c10::DispatchKey::SparseCPU, c10::DispatchKey::SparseCUDA}) {
    m.impl(name.c_str(), torch::dispatch(key, torch::CppFunction::makeFromBoxedFunction<&refuse_sparse>()));
  }
}

// Runs kernel(device, view, flag) on the flag's device (nothing for Meta), then writes written
// temporaries back.
template <class Device, class Kernel>
void launch_lists(Lists& lists, const at::Tensor& flag, Kernel&& kernel) {
  launch<Device>(flag, [&](const auto& device) {
    kernel(device, lists.view(), flag_ptr(flag));
    lists.write_back();
  });
}

// A scalar tensor argument (lr, step, inv_scale, ...): `count` elements (one per tensor of the
// call) or one, on the flag's device (read by the kernel) or a one-element CPU tensor (read now).
inline void check_scalar(const char* op, const char* what, const at::Tensor& x, const at::Tensor& flag,
                         int64_t count) {
  APEX_CHECK(x.defined(), op, ": ", what, " is undefined");
  const bool one = x.sym_numel() == 1;
  APEX_CHECK(one || x.sym_numel() == count, op, ": ", what, " must have one element",
             count > 1 ? " or one per tensor (" + std::to_string(count) + ")" : std::string(), ", got ",
             x.sym_numel());
  APEX_CHECK(x.device() == flag.device() || (x.is_cpu() && one), op, ": ", what, " is on ", x.device(),
             " but the tensors are on ", flag.device(), " (a CPU ", what, " must have one element)");
  APEX_CHECK(at::isFloatingType(x.scalar_type()) || at::isIntegralType(x.scalar_type(), /*includeBool=*/false), op,
             ": ", what, " must be a floating point or integer tensor, got ", x.scalar_type());
}

// The kernels' view of a checked scalar tensor: a pointer to float32 values on the kernels' device
// (converted copies are kept alive in `keep`), or the value of a one-element CPU tensor.
inline ScalarArg scalar_arg(const at::Tensor& x, const at::Tensor& flag, std::vector<at::Tensor>& keep) {
  ScalarArg arg;
  if (x.device() != flag.device()) {
    arg.value = x.scalar_type() == at::kFloat ? *x.const_data_ptr<float>() : static_cast<float>(x.item<double>());
    return arg;
  }
  at::Tensor values = x;
  if (x.scalar_type() != at::kFloat || !x.is_contiguous()) {
    values = x.to(at::kFloat).contiguous();  // stream-ordered on the device: CUDA graphs can capture it
    keep.push_back(values);
  }
  arg.ptr = values.const_data_ptr<float>();
  arg.per_tensor = values.numel() > 1;
  return arg;
}

// A value known now (a Python float of the op's schema) as a kernel ScalarArg.
inline ScalarArg scalar_arg(double value) {
  ScalarArg arg;
  arg.value = static_cast<float>(value);
  return arg;
}

// Scratch a reduction over `count` tensors needs on `device`, from torch's caching allocator.
template <class Device>
at::Tensor reduction_buffer(const Device& device, const at::Tensor& flag, int64_t count) {
  return at::empty({reduction_scratch(device, count)}, flag.options().dtype(at::kFloat));
}

// Lists a and b hold one dtype.
inline void check_same_dtype(const Lists& lists, int a, int b) {
  if (!lists.has(a) || !lists.has(b)) return;
  APEX_CHECK(lists.scalar_type(a) == lists.scalar_type(b), lists.op(), ": ", lists.name(a), " and ", lists.name(b),
             " must share one dtype, got ", lists.scalar_type(a), " and ", lists.scalar_type(b));
}

// Lists `which` are float32 (optimizer state and scratch lists that kernels take in float32 only).
inline void require_float32(const Lists& lists, std::initializer_list<int> which) {
  for (int l : which) {
    if (!lists.has(l)) continue;
    APEX_CHECK(lists.scalar_type(l) == at::kFloat, lists.op(), ": ", lists.name(l), " must be float32, got ",
               lists.scalar_type(l));
  }
}

// Optimizer state list `state` of params list `params`: the params' dtype, or float32 for
// float16/bfloat16 params.
inline void check_state_dtype(const Lists& lists, int params, int state) {
  if (!lists.has(state)) return;
  const at::ScalarType p = lists.scalar_type(params), s = lists.scalar_type(state);
  const bool reduced = p == at::kHalf || p == at::kBFloat16;
  APEX_CHECK(s == p || (reduced && s == at::kFloat), lists.op(), ": ", lists.name(state),
             reduced ? " must be float32 or the params' dtype (" : " must have the params' dtype (", p, "), got ", s);
}

}  // namespace apex::multi_tensor
