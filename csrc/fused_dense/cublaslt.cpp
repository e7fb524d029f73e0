// fused_dense: the one cuBLASLt call (GPU builds only), with torch's cuBLASLt handle and workspace.
//
// cuBLAS is column-major, torch row-major: a row-major out[rows, cols] = a @ b is, to cuBLAS, the
// column-major out^T[cols, rows] = b^T @ a^T. So cuBLAS's A is our b, its B our a, m = cols, n = rows,
// and a per-column bias of `out` is cuBLAS's per-row bias (the epilogue's).
//
// ROCm builds (not run here) take no cuBLASLt path: every GEMM goes through ATen (hipBLAS) and the
// epilogue kernels, as when cuBLASLt offers no algorithm.
#if defined(APEX_WITH_CUDA) && (defined(USE_ROCM) || defined(__HIP_PLATFORM_AMD__))

#include "dense.h"

namespace apex::fused_dense {
bool lt_matmul(const Cuda&, const LtMatmul&) { return false; }
}  // namespace apex::fused_dense

#elif defined(APEX_WITH_CUDA)

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "dense.h"

namespace apex::fused_dense {
namespace {

void check_status(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("fused_dense: ") + what + " failed: " + cublasLtGetStatusString(status));
  }
}

// The descriptors, destroyed whatever happens.
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* desc) const { cublasLtMatmulDescDestroy(desc); }
  void operator()(cublasLtMatrixLayoutOpaque_t* layout) const { cublasLtMatrixLayoutDestroy(layout); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* preference) const { cublasLtMatmulPreferenceDestroy(preference); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter>;

cudaDataType_t cuda_type(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat16: return CUDA_R_16F;
    case Dtype::kBFloat16: return CUDA_R_16BF;
    case Dtype::kFloat32: return CUDA_R_32F;
    case Dtype::kFloat64: break;
  }
  throw std::invalid_argument("fused_dense: cuBLASLt path takes float32, float16 or bfloat16 only");
}

// A column-major layout of `rows x cols` stored with leading dimension ld.
Layout layout(Dtype dtype, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  check_status(cublasLtMatrixLayoutCreate(&raw, cuda_type(dtype), static_cast<uint64_t>(rows),
                                          static_cast<uint64_t>(cols), ld),
               "cublasLtMatrixLayoutCreate");
  return Layout(raw);
}

// The layout cuBLAS reads `op(X)` of `op_rows x op_cols` from: stored transposed or not.
Layout operand_layout(Dtype dtype, int64_t op_rows, int64_t op_cols, int64_t ld, bool op_transposes) {
  return op_transposes ? layout(dtype, op_cols, op_rows, ld) : layout(dtype, op_rows, op_cols, ld);
}

template <class T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  check_status(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
}

template <class T>
void set(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  check_status(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)),
               "cublasLtMatmulPreferenceSetAttribute");
}

cublasLtEpilogue_t lt_epilogue(LtEpilogue epilogue) {
  switch (epilogue) {
    case LtEpilogue::kNone: return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::kRelu: return CUBLASLT_EPILOGUE_RELU;
    case LtEpilogue::kBiasRelu: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case LtEpilogue::kGelu: return CUBLASLT_EPILOGUE_GELU;
    case LtEpilogue::kBiasGelu: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case LtEpilogue::kGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogue::kBiasGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool uses_aux(LtEpilogue e) { return e == LtEpilogue::kGeluAux || e == LtEpilogue::kBiasGeluAux; }

// The largest power of two (up to the 256 bytes cuBLASLt assumes by default) dividing the address:
// what cuBLASLt may assume of a buffer, so that views at any offset stay correct.
uint32_t alignment_of(const void* ptr) {
  constexpr uintptr_t kMaxAlignment = 256;
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  uintptr_t alignment = 1;
  while (alignment < kMaxAlignment && address % (alignment * 2) == 0) alignment *= 2;
  return static_cast<uint32_t>(alignment);
}

// cuBLASLt's choice for problems seen before: its heuristic costs tens of microseconds of host time
// a call. Keyed by everything the choice depends on (sizes, layouts, types, epilogue, alignments,
// workspace); a problem it had no algorithm for is remembered too.
using AlgoKey = std::array<int64_t, 21>;

struct AlgoKeyHash {
  size_t operator()(const AlgoKey& key) const {
    size_t hash = 0;
    for (const int64_t value : key) hash = hash * 1000003u ^ std::hash<int64_t>{}(value);
    return hash;
  }
};

class AlgoCache {
 public:
  // The remembered choice (nullopt inside: no algorithm), or nullopt if the problem is new.
  std::optional<std::optional<cublasLtMatmulAlgo_t>> find(const AlgoKey& key) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto found = choices_.find(key);
    if (found == choices_.end()) return std::nullopt;
    return found->second;
  }

  void remember(const AlgoKey& key, std::optional<cublasLtMatmulAlgo_t> algo) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (choices_.size() >= kMaxEntries) choices_.clear();  // a bound for ever-changing shapes
    choices_[key] = algo;
  }

 private:
  static constexpr size_t kMaxEntries = 4096;
  std::mutex mutex_;
  std::unordered_map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>, AlgoKeyHash> choices_;
};

AlgoCache& algo_cache() {
  static AlgoCache cache;
  return cache;
}

}  // namespace

bool lt_matmul(const Cuda& device, const LtMatmul& args) {
  // cuBLAS's view: D[m, n] = op(A)[m, k] @ op(B)[k, n] with A = our b, B = our a.
  const int64_t m = args.cols, n = args.rows, k = args.depth;
  const cublasOperation_t transa = args.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t transb = args.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;

  // float32 inputs use TF32 tensor cores only where torch's matmuls would (torch.backends.cuda.matmul).
  const cublasComputeType_t compute = args.input_dtype == Dtype::kFloat32 && at::globalContext().allowTF32CuBLAS()
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw_desc = nullptr;
  check_status(cublasLtMatmulDescCreate(&raw_desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const MatmulDesc desc(raw_desc);
  set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, transa);
  set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, transb);
  set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(args.epilogue));
  if (args.bias != nullptr) set(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, args.bias);
  if (uses_aux(args.epilogue)) {
    set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, args.aux);
    set(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, args.ld_aux);
  }

  const Layout a_layout = operand_layout(args.input_dtype, m, k, args.b.ld, transa == CUBLAS_OP_T);
  const Layout b_layout = operand_layout(args.input_dtype, k, n, args.a.ld, transb == CUBLAS_OP_T);
  const Layout d_layout = layout(args.out_dtype, m, n, args.ld_out);

  const size_t workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();
  void* workspace = at::cuda::getCUDABlasLtWorkspace();
  const cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  const uint32_t align_a = alignment_of(args.b.data), align_b = alignment_of(args.a.data);
  const uint32_t align_d = alignment_of(args.out);
  const AlgoKey key = {device.device, m, n, k, args.b.ld, args.a.ld, args.ld_out, args.ld_aux, transa, transb,
                       static_cast<int64_t>(args.epilogue), static_cast<int64_t>(args.input_dtype),
                       static_cast<int64_t>(args.out_dtype), compute, args.accumulate, align_a, align_b, align_d,
                       alignment_of(args.bias), alignment_of(args.aux),
                       static_cast<int64_t>(workspace_size)};
  std::optional<cublasLtMatmulAlgo_t> algo;
  if (auto known = algo_cache().find(key)) {
    algo = *known;
  } else {
    cublasLtMatmulPreference_t raw_preference = nullptr;
    check_status(cublasLtMatmulPreferenceCreate(&raw_preference), "cublasLtMatmulPreferenceCreate");
    const Preference preference(raw_preference);
    set(raw_preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_size));
    set(raw_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    set(raw_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    set(raw_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
    set(raw_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
    cublasLtMatmulHeuristicResult_t heuristic = {};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, raw_desc, a_layout.get(), b_layout.get(),
                                                                 d_layout.get(), d_layout.get(), raw_preference, 1,
                                                                 &heuristic, &found);
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) algo = heuristic.algo;
    algo_cache().remember(key, algo);
  }
  if (!algo.has_value()) return false;  // not offered: the caller's other way

  const float alpha = 1.0f, beta = args.accumulate ? 1.0f : 0.0f;
  const cublasStatus_t launched =
      cublasLtMatmul(handle, raw_desc, &alpha, args.b.data, a_layout.get(), args.a.data, b_layout.get(), &beta,
                     args.out, d_layout.get(), args.out, d_layout.get(), &*algo, workspace, workspace_size,
                     static_cast<cudaStream_t>(device.stream));
  if (launched == CUBLAS_STATUS_NOT_SUPPORTED) return false;  // refused before launching anything
  check_status(launched, "cublasLtMatmul");
  return true;
}

}  // namespace apex::fused_dense

#endif  // APEX_WITH_CUDA
