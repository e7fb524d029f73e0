#pragma once
// Differentiable ops: an op struct (see op.h) with two more members becomes an autograd op whose
// formula runs in C++ (no Python per call, eager or compiled):
//
//   struct Scale {
//     static constexpr const char* kSchema = "my_op_scale(Tensor x, float alpha) -> Tensor";
//     template <class Device> static at::Tensor call(const at::Tensor& x, double alpha);
//     // What backward needs, given the forward's arguments and outputs.
//     static void save(AutogradContext& ctx, const at::Tensor& x, double alpha, const at::Tensor& out) {
//       ctx.saved_data["alpha"] = alpha;
//     }
//     // One gradient per forward argument, in order (one per tensor of a Tensor[] argument); undefined
//     // for non-tensors and tensors without one; trailing ones may be left out.
//     static Grads backward(AutogradContext& ctx, Grads grads) {
//       return {apex::call_op<Scale>(grads[0], ctx.saved_data["alpha"].toDouble())};
//     }
//   };
//   APEX_LIBRARY(m) { apex::define_differentiable<Scale>(m); }
//
// The formula is registered for the Autograd key, so torch.compile and torch.export trace it
// (AOTAutograd runs it on fake tensors, and the ops it calls go through their Meta kernels). A
// backward that calls ops through apex::call_op is traced the same way; double backward works where
// those ops are differentiable themselves. torch.func transforms do not take C++ formulas.
//
// The graph node is apex's own (OpNode below), not torch::autograd::Function's CppNode: an eager
// call records one node holding the context, its saved variables and, per forward argument,
// whether it is a tensor, as torch's generated nodes do. CppNode costs more per call (it keeps
// metadata of every input and output, demangles its own type name on every backward, and runs
// generic output wrapping); measured on a CPU LayerNorm forward+backward it was ~1/3 of the host
// cost above torch's. The context keeps CppNode's AutogradContext API (saved_data,
// save_for_backward, get_saved_variables, mark_non_differentiable, set_materialize_grads,
// needs_input_grad), so formulas are written as for torch::autograd::Function.

#include <ATen/FuncTorchTLS.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable_info.h>
#include <torch/version.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "apex/op.h"

namespace apex {

using Grads = torch::autograd::variable_list;

namespace detail {
// The base of apex's autograd nodes. Where nodes are intrusive_ptr-owned (torch >= 2.13), the
// release of the last strong reference also drops what the node saved (weak references, from a
// grad_fn held in Python say, may keep the node itself alive longer).
template <bool kIntrusive = std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>,
          class Unused = void>  // keeps the specialization below a template: never compiled unless chosen
struct NodeBase : torch::autograd::Node {
  virtual void release_saved_state() {}
};
template <class Unused>
struct NodeBase<true, Unused> : torch::autograd::Node {
  virtual void release_saved_state() {}
  // Named through Unused so that the call is looked up only where this specialization is chosen.
  using Base = std::conditional_t<std::is_void_v<Unused>, torch::autograd::Node, torch::autograd::Node>;
  void release_resources() override {
    Base::release_resources();
    release_saved_state();
  }
};

template <class Op, class Sig>
struct OpNode;
}

// Non-tensor values a formula keeps for backward, by name: ctx.saved_data["eps"] = eps, then
// ctx.saved_data["eps"].toDouble(). A node holds a handful, so they live in the node itself and
// are found by comparing names: no hashing and no table allocated per recorded call (a hash map
// cost a LayerNorm call ~0.4 us of host time).
class SavedData {
 public:
  // The value saved under `name`; a new None value, to assign to, when there is none yet.
  at::IValue& operator[](std::string_view name) {
    for (auto& [key, value] : entries_) {
      if (key == name) return value;
    }
    return entries_.emplace_back(std::string(name), at::IValue()).second;
  }
  void clear() { entries_.clear(); }

 private:
  c10::SmallVector<std::pair<std::string, at::IValue>, 4> entries_;
};

// What a formula keeps between forward (Op::save) and backward (Op::backward): the API of
// torch::autograd::AutogradContext, which formulas were first written against.
class AutogradContext {
 public:
  AutogradContext() = default;
  AutogradContext(const AutogradContext&) = delete;
  AutogradContext& operator=(const AutogradContext&) = delete;

  // Non-tensor data for backward (scalars, flags, shapes): ctx.saved_data["eps"] = eps.
  SavedData saved_data;

  // Tensors for backward (inputs or outputs; undefined ones allowed); at most once per forward.
  void save_for_backward(Grads to_save) { to_save_ = std::move(to_save); }

  // The saved tensors, checked against in-place changes since the forward.
  Grads get_saved_variables() const {
    TORCH_CHECK(!released_, torch::autograd::ERR_BACKWARD_TWICE);
    Grads out;
    out.reserve(saved_.size());
    const auto node = node_->getptr();  // intrusive_ptr from torch 2.13, shared_ptr before
    for (const torch::autograd::SavedVariable& saved : saved_) out.push_back(saved.unpack(node));
    return out;
  }

  // Outputs that get no gradient (statistics, indices): they never require grad, and backward sees
  // an undefined (or, with materialized grads, zero) gradient for them.
  void mark_non_differentiable(const Grads& outputs) {
    for (const at::Tensor& t : outputs) {
      if (t.defined()) non_differentiable_.push_back(t.unsafeGetTensorImpl());
    }
  }

  // Whether backward sees zeros (default) or undefined tensors for outputs that got no gradient.
  void set_materialize_grads(bool value) { materialize_grads_ = value; }

  // Whether the gradient of the index-th tensor input (counting tensors only, each tensor of a
  // Tensor[] argument, defined optional tensors) is needed by this backward.
  bool needs_input_grad(size_t tensor_input_index) const { return node_->task_should_compute_output(tensor_input_index); }
  bool needs_input_grad(std::initializer_list<std::pair<size_t, size_t>> ranges) const {
    for (const auto& [begin, end] : ranges) {
      for (size_t i = begin; i < end; ++i) {
        if (needs_input_grad(i)) return true;
      }
    }
    return false;
  }

 private:
  template <class Op, class Sig>
  friend struct detail::OpNode;

  // After the outputs are attached to `node`: saved tensors that are its outputs are held without
  // a reference to it (SavedVariable's rule, no cycle).
  void save_variables(torch::autograd::Node* node) {
    saved_.reserve(to_save_.size());
    for (const at::Tensor& t : to_save_) {
      if (t.defined()) {
        saved_.emplace_back(t, /*is_output=*/t.grad_fn().get() == node);
      } else {
        saved_.emplace_back();
      }
    }
    to_save_.clear();
  }

  // After a backward that keeps no graph.
  void release() {
    saved_.clear();
    released_ = true;
  }

  // When the node dies: what it holds goes now, also where weak references to the node remain
  // (saved outputs hold one), which would otherwise keep it all alive.
  void clear() {
    release();
    saved_data.clear();
    to_save_.clear();
    non_differentiable_.clear();
  }

  bool is_non_differentiable(const at::Tensor& t) const {
    return std::find(non_differentiable_.begin(), non_differentiable_.end(), t.unsafeGetTensorImpl()) !=
           non_differentiable_.end();
  }

  Grads to_save_;
  std::vector<torch::autograd::SavedVariable> saved_;
  c10::SmallVector<at::TensorImpl*, 4> non_differentiable_;  // a few outputs: a search beats a hash set
  torch::autograd::Node* node_ = nullptr;  // the node that owns this context
  bool materialize_grads_ = true;
  bool released_ = false;
};

namespace detail {

template <class T>
struct IsTuple : std::false_type {};
template <class... T>
struct IsTuple<std::tuple<T...>> : std::true_type {};

// An op's outputs as autograd's list, and back.
template <class Ret>
Grads as_list(Ret&& outputs) {
  using R = std::decay_t<Ret>;
  if constexpr (std::is_same_v<R, at::Tensor>) {
    return {std::move(outputs)};
  } else if constexpr (IsTuple<R>::value) {
    return std::apply([](auto&&... t) { return Grads{std::move(t)...}; }, std::move(outputs));
  } else {
    static_assert(std::is_same_v<R, std::vector<at::Tensor>>, "differentiable ops return Tensor, a tuple or Tensor[]");
    return Grads(outputs.begin(), outputs.end());
  }
}

template <class Ret, size_t... I>
Ret tuple_from_list(Grads& list, std::index_sequence<I...>) {
  return Ret{std::move(list[I])...};
}

template <class Ret>
Ret from_list(Grads&& list) {
  if constexpr (std::is_same_v<Ret, at::Tensor>) {
    return std::move(list[0]);
  } else if constexpr (IsTuple<Ret>::value) {
    return tuple_from_list<Ret>(list, std::make_index_sequence<std::tuple_size_v<Ret>>{});
  } else {
    return Ret(list.begin(), list.end());
  }
}

inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) { return t.has_value() && requires_grad(*t); }
inline bool requires_grad(at::TensorList list) {
  for (const at::Tensor& t : list) {
    if (requires_grad(t)) return true;
  }
  return false;
}
template <class T, std::enable_if_t<!std::is_convertible_v<const T&, at::TensorList>, int> = 0>
bool requires_grad(const T&) {
  return false;
}

// Per-call lists sized by the op's arguments: held in place up to a typical op's count (no heap
// allocation per recorded call), longer ones (tensor lists) spill to the heap.
constexpr unsigned kInlineArguments = 8;
using InputList = c10::SmallVector<at::Tensor, kInlineArguments>;
using SlotFlags = c10::SmallVector<bool, kInlineArguments>;

// The autograd inputs of one forward argument, in the order Op::backward returns their grads: a
// tensor; each tensor of a tensor list; an optional tensor when it is defined; nothing else.
// `is_tensor` gets one flag per gradient slot (per argument, per tensor of a list).
inline void add_inputs(InputList& inputs, SlotFlags& is_tensor, const at::Tensor& t) {
  is_tensor.push_back(true);
  inputs.push_back(t);
}
inline void add_inputs(InputList& inputs, SlotFlags& is_tensor, const std::optional<at::Tensor>& t) {
  const bool given = t.has_value() && t->defined();
  is_tensor.push_back(given);
  if (given) inputs.push_back(*t);
}
inline void add_inputs(InputList& inputs, SlotFlags& is_tensor, at::TensorList list) {
  for (const at::Tensor& t : list) add_inputs(inputs, is_tensor, t);
}
template <class T, std::enable_if_t<!std::is_convertible_v<const T&, at::TensorList>, int> = 0>
void add_inputs(InputList&, SlotFlags& is_tensor, const T&) {
  is_tensor.push_back(false);
}

// The graph node of one recorded call of Op.
template <class Op, class Ret, class... Args>
struct OpNode<Op, Ret(Args...)> final : NodeBase<> {
  AutogradContext ctx;
  SlotFlags is_tensor;                                     // per gradient slot of Op::backward
  std::vector<torch::autograd::VariableInfo> output_info;  // for materialized grads only

  // Records the call: runs the op below autograd, lets Op::save keep what backward needs, and
  // makes the differentiable outputs this node's.
  static Ret record(Args... args) {
    if (const auto& functorch = at::functorch::functorchTLSAccessor()) {
      functorch->checkSupportsCppAutogradFunction();  // torch.func transforms do not take C++ formulas
    }
    auto node = make_node();
    node->ctx.node_ = node.get();
    InputList inputs;
    (add_inputs(inputs, node->is_tensor, args), ...);
    node->set_next_edges(torch::autograd::collect_next_edges(at::TensorList(inputs)));
    Grads outputs;
    {
      const at::AutoGradMode no_grad(false);
      Ret result = [&] {
        const at::AutoDispatchBelowADInplaceOrView below_autograd;
        return call_op<Op>(args...);
      }();
      Op::save(node->ctx, args..., result);
      outputs = as_list(std::move(result));
    }
    node->attach(outputs, inputs);
    node->ctx.save_variables(node.get());
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
    // torch 2.14 added node-creation hooks and fires them for every custom function's node; older
    // torch has neither the hooks nor this function.
    torch::autograd::fire_node_creation_hooks(node);
#endif
    return from_list<Ret>(std::move(outputs));
  }

  // torch's rule for a custom function's outputs: one gradient slot per output; outputs marked
  // non-differentiable or of a type without gradients (integers, bool) get none; an output that is
  // an input is returned as a view of it, so that the input keeps its own history.
  void attach(Grads& outputs, const InputList& inputs) {
    if (ctx.materialize_grads_) output_info.reserve(outputs.size());
    for (at::Tensor& out : outputs) {
      if (ctx.materialize_grads_) {
        if (out.defined()) {
          output_info.emplace_back(out);
        } else {
          output_info.emplace_back();
        }
      }
      if (!out.defined() || ctx.is_non_differentiable(out) ||
          !torch::autograd::isDifferentiableType(out.scalar_type())) {
        add_input_metadata(Node::undefined_input());
        continue;
      }
      for (const at::Tensor& in : inputs) {
        if (in.defined() && in.unsafeGetTensorImpl() == out.unsafeGetTensorImpl()) {
          out = out.view_as(out);
          break;
        }
      }
      const uint32_t slot = add_input_metadata(out);
      torch::autograd::impl::set_gradient_edge(out, {getptr(), slot});
    }
  }

  Grads apply(Grads&& grad_outputs) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (ctx.materialize_grads_) {
      at::OptionalDeviceGuard device_guard;
      for (size_t i = 0; i < grad_outputs.size(); ++i) {
        if (!grad_outputs[i].defined()) grad_outputs[i] = output_info[i].zeros(device_guard);
      }
    }
    // One gradient per slot (trailing ones may be missing); autograd wants one per tensor input.
    Grads grads = Op::backward(ctx, std::move(grad_outputs));
    TORCH_CHECK(grads.size() <= is_tensor.size(), name(), ": backward returned ", grads.size(),
                " gradients, the forward has ", is_tensor.size(), " inputs");
    Grads result;
    result.reserve(num_outputs());
    for (size_t i = 0; i < is_tensor.size(); ++i) {
      const bool given = i < grads.size() && grads[i].defined();
      if (!is_tensor[i]) {
        TORCH_CHECK(!given, name(), ": backward returned a gradient for argument ", i, ", which is not a tensor");
        continue;
      }
      // A gradient toward an input without an edge (undefined, or needing no grad) is dropped: torch
      // before 2.14 validates it against the input's metadata, which an undefined input lacks.
      const bool wanted = given && next_edge(result.size()).is_valid();
      result.push_back(wanted ? std::move(grads[i]) : at::Tensor());
    }
    return result;
  }

  std::string name() const override {
    static const std::string kName = "apex::" + op_name(Op::kSchema) + "_backward";
    return kName;
  }

  void release_variables() override {
    const std::lock_guard<std::mutex> lock(mutex_);
    ctx.release();
  }

  void release_saved_state() override {
    ctx.clear();
    output_info.clear();
  }

  // torch 2.13 made autograd nodes intrusive_ptr-owned (before: std::shared_ptr).
  static auto make_node() {
    if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>) {
      return c10::make_intrusive<OpNode>();
    } else {
      return std::make_shared<OpNode>();
    }
  }
};

// The Autograd-key kernel: the formula when the call records a graph, else straight to the
// device's kernel (a call under no_grad, or on tensors that need no grad, costs no autograd node).
template <class Op, class Sig>
struct AutogradKernel;
template <class Op, class Ret, class... Args>
struct AutogradKernel<Op, Ret(Args...)> {
  static Ret kernel(Args... args) {
    if (at::GradMode::is_enabled() && (requires_grad(args) || ...)) {
      return OpNode<Op, Ret(Args...)>::record(args...);
    }
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_op<Op>(args...);
  }
};

}  // namespace detail

// define<Op> (op.h) with Op's formula (Op::save, Op::backward) as its autograd.
template <class Op>
void define_differentiable(torch::Library& m) {
  m.impl(detail::declare<Op>(m).c_str(),
         torch::dispatch(c10::DispatchKey::Autograd,
                         TORCH_FN((detail::AutogradKernel<Op, detail::Signature<Op>>::kernel))));
}

}  // namespace apex
