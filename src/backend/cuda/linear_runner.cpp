#include "backend/cuda/linear_runner.h"

#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops_quant_gemv.h"

namespace moeserve::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

// Matmul descriptors and the chosen algorithm per problem shape, built once.
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

using PlanKey = std::tuple<int, int, int, bool>;  // M, N, K, f32 output

std::mutex g_plans_mutex;
std::map<std::pair<cublasLtHandle_t, PlanKey>, GemmPlan> g_plans;

const GemmPlan& plan_for(cublasLtHandle_t handle, int M, int N, int K, bool y_f32) {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  auto key = std::make_pair(handle, PlanKey{M, N, K, y_f32});
  auto it = g_plans.find(key);
  if (it != g_plans.end()) return it->second;
  GemmPlan p;
  // Row-major Y[M,N] = X[M,K]·Wᵀ is column-major Yᵀ[N,M] = op(W)·Xᵀ with W viewed as the
  // column-major [K,N] matrix (ld K) transposed, and X as column-major [K,M] (ld K).
  MOESERVE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MOESERVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MOESERVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  MOESERVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K));
  MOESERVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));
  MOESERVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, y_f32 ? CUDA_R_32F : CUDA_R_16BF, N, M, N));
  cublasLtMatmulPreference_t pref;
  MOESERVE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  MOESERVE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                             sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MOESERVE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0)
    throw Error("cuBLASLt found no bf16 GEMM algorithm for M=" + std::to_string(M) + " N=" + std::to_string(N) +
                " K=" + std::to_string(K));
  p.algo = result.algo;
  return g_plans.emplace(key, p).first->second;
}

}  // namespace

LinearRunner::LinearRunner(size_t max_dense_elems, bool batch_invariant) : batch_invariant_(batch_invariant) {
  MOESERVE_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_.resize(kWorkspaceBytes);
  if (max_dense_elems) scratch_.resize(max_dense_elems);
}

LinearRunner::~LinearRunner() {
  if (handle_) cublasLtDestroy(handle_);
}

void LinearRunner::gemm_bf16(const bf16* x, int M, const bf16* w, int N, int K, void* y, bool y_f32,
                             bool accumulate, cudaStream_t stream) {
  const GemmPlan& p = plan_for(handle_, M, N, K, y_f32);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  MOESERVE_CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                                       workspace_.data(), workspace_.bytes(), stream));
}

void LinearRunner::run(const bf16* x, int M, const DeviceLinear& w, void* y, bool y_f32, cudaStream_t stream,
                       bool accumulate) {
  if (M == 0) return;
  if (accumulate && !y_f32) throw Error("LinearRunner: accumulation needs an f32 output");
  const int N = int(w.N), K = int(w.K);
  if (batch_invariant_) {  // one kernel family for every M: a row's result never depends on its batch
    quant_gemv(x, M, w, y, y_f32, accumulate, stream);
    return;
  }
  if (w.format == quant::WeightFormat::Dense || w.format == quant::WeightFormat::Nvfp4) {
    gemm_bf16(x, M, w.dense.data(), N, K, y, y_f32, accumulate, stream);
    return;
  }
  if (M <= kSmallM) {
    quant_gemv(x, M, w, y, y_f32, accumulate, stream);
    return;
  }
  if (scratch_.size() < size_t(N) * size_t(K))
    throw Error("LinearRunner: dequantisation scratch of " + std::to_string(scratch_.size()) +
                " elements is smaller than a " + std::to_string(N) + "x" + std::to_string(K) + " weight");
  dequantize_to_bf16(w, scratch_.data(), stream);
  gemm_bf16(x, M, scratch_.data(), N, K, y, y_f32, accumulate, stream);
}

void LinearRunner::run(const float* x, int M, const DeviceLinear& w, void* y, bool y_f32, cudaStream_t stream,
                       bool accumulate) {
  if (M == 0) return;
  if (accumulate && !y_f32) throw Error("LinearRunner: accumulation needs an f32 output");
  quant_gemv(x, M, w, y, y_f32, accumulate, stream);
}

}  // namespace moeserve::cuda
