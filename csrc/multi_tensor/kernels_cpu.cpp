// Every multi-tensor kernel on the CPU: each family's dispatch (its header) run by the CPU engine.
// One translation unit: the engine's ATen headers are paid once, and the engine converts dtypes
// at run time, so each functor's loop is compiled once whatever the dtypes of its lists.
#include "adadelta.h"
#include "adagrad.h"
#include "adam.h"
#include "adamp.h"
#include "apex/multi_tensor_apply_cpu.h"
#include "l2norm.h"
#include "lamb.h"
#include "lars.h"
#include "novograd.h"
#include "rmsprop.h"
#include "scale.h"
#include "sgd.h"
#include "update_scale_hysteresis.h"

namespace apex::multi_tensor {

void scale(const Cpu& d, const TensorLists& l, int* flag, const ScaleFunctor& op) {
  run_scale<CpuEngine>(d, l, flag, op);
}
void axpby(const Cpu& d, const TensorLists& l, int* flag, const AxpbyFunctor& op) {
  run_axpby<CpuEngine>(d, l, flag, op);
}
void norm(const Cpu& d, const TensorLists& l, int* flag, const NormArgs& args) {
  run_norm<CpuEngine>(d, l, flag, args);
}
void update_scale_hysteresis(const Cpu& d, const ScaleHysteresisUpdate& update) { CpuEngine::run_once(d, update); }

void adam(const Cpu& d, const TensorLists& l, int* flag, const AdamFunctor& op) { run_adam<CpuEngine>(d, l, flag, op); }
void sgd(const Cpu& d, const TensorLists& l, int* flag, const SgdFunctor& op) {
  run_momentum_step<CpuEngine>(d, l, flag, op);
}
void lars(const Cpu& d, const TensorLists& l, int* flag, const LarsFunctor& op) {
  run_momentum_step<CpuEngine>(d, l, flag, op);
}
void lamb(const Cpu& d, const TensorLists& l, int* flag, const LambArgs& args, const LambBuffers& buffers) {
  run_lamb<CpuEngine>(d, l, flag, args, buffers);
}
void lamb_direction(const Cpu& d, const TensorLists& l, int* flag, const LambDirectionFunctor& op) {
  run_lamb_direction<CpuEngine>(d, l, flag, op);
}
void lamb_stage2(const Cpu& d, const TensorLists& l, int* flag, const LambStage2Functor& op) {
  run_lamb_stage2<CpuEngine>(d, l, flag, op);
}
void novograd_update(const Cpu& d, const TensorLists& l, int* flag, const NovogradFunctor& op) {
  run_novograd_update<CpuEngine>(d, l, flag, op);
}
void adagrad(const Cpu& d, const TensorLists& l, int* flag, const AdagradFunctor& op) {
  run_adagrad<CpuEngine>(d, l, flag, op);
}
void rmsprop(const Cpu& d, const TensorLists& l, int* flag, const RmspropFunctor& op) {
  run_rmsprop<CpuEngine>(d, l, flag, op);
}
void adadelta(const Cpu& d, const TensorLists& l, int* flag, const AdadeltaFunctor& op) {
  run_adadelta<CpuEngine>(d, l, flag, op);
}

namespace {

// The tensor that global row `row` belongs to: the last one starting at or before it.
int64_t tensor_of_row(const RowLayout& layout, int64_t row) {
  return std::upper_bound(layout.first_row.begin(), layout.first_row.end(), row) - layout.first_row.begin() - 1;
}

// Calls body(tensor, row, begin, end) for every row of the call, rows spread over torch's threads.
template <class Body>
void for_each_row(const TensorLists& lists, const RowLayout& layout, Body&& body) {
  at::parallel_for(0, layout.rows, cpu_detail::units_per_task(lists, layout.rows), [&](int64_t first, int64_t last) {
    for (int64_t row = first; row < last; ++row) {
      const int64_t t = tensor_of_row(layout, row);
      const int64_t length = RowLayout::row_length(lists, t), begin = (row - layout.first_row[t]) * length;
      body(t, row, begin, begin + length);
    }
  });
}

}  // namespace

// AdamP on the CPU: a row is one task, so the first pass writes one set of sums per row.
void adamp(const Cpu&, const TensorLists& lists, int* /*flag*/, const AdampArgs& args, const AdampBuffers& buffers) {
  using Vec = at::vec::Vectorized<float>;
  const RowLayout layout(lists);
  AdampStatsFunctor stats;
  stats.a = args;
  for_each_row(lists, layout, [&](int64_t t, int64_t row, int64_t begin, int64_t end) {
    const AdampStatsFunctor op = stats.at_tensor(t);
    Vec acc[kAdampSums] = {Vec(0), Vec(0), Vec(0), Vec(0)};
    cpu_detail::for_each_vector<4, float>(lists, t, begin, end, op.reads(), op.writes(), [&](Vec (&x)[4], int) {
      const auto terms = op(x[0], x[1], x[2], x[3]);
      for (int k = 0; k < kAdampSums; ++k) acc[k] = acc[k] + terms.v[k];
    });
    for (int k = 0; k < kAdampSums; ++k) buffers.piece_sums[row * kAdampSums + k] = cpu_detail::lane_sum(acc[k]);
  });
  at::parallel_for(0, lists.count, cpu_detail::units_per_task(lists, lists.count), [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const int64_t rows = RowLayout::row_count(lists, t), length = RowLayout::row_length(lists, t);
      const float* sums = buffers.piece_sums + layout.first_row[t] * kAdampSums;
      float totals[kAdampSums] = {}, max_cosine = 0.f;
      for (int64_t r = 0; r < rows; ++r) {
        max_cosine = ScalarMath<float>::max(max_cosine, AdampDecision::cosine(sums + r * kAdampSums, args.epsilon));
        for (int k = 0; k < kAdampSums; ++k) totals[k] += sums[r * kAdampSums + k];
      }
      AdampDecision d;
      const bool projectable = lists.rows[t] > 0;
      d.channel = projectable && max_cosine < args.delta / std::sqrt(static_cast<float>(length));
      d.layer = projectable && !d.channel &&
                AdampDecision::cosine(totals, args.epsilon) < args.delta / std::sqrt(static_cast<float>(length * rows));
      for (int64_t r = 0; r < rows; ++r) {
        buffers.coefficients[layout.first_row[t] + r] =
            d.channel ? AdampDecision::coefficient(sums + r * kAdampSums, args.epsilon)
                      : d.layer ? AdampDecision::coefficient(totals, args.epsilon) : 0.f;
      }
      buffers.decay[t] = d.decay(args);
    }
  });
  AdampApplyFunctor apply;
  apply.a = args;
  apply.coefficients = buffers.coefficients;
  apply.decay = buffers.decay;
  for_each_row(lists, layout, [&](int64_t t, int64_t row, int64_t begin, int64_t end) {
    const AdampApplyFunctor op = apply.at_tensor(t).at_row(row);
    cpu_detail::for_each_vector<4, float>(lists, t, begin, end, op.reads(), op.writes(),
                                          [&](Vec (&x)[4], int) { op(x[0], x[1], x[2], x[3]); });
  });
}

}  // namespace apex::multi_tensor
