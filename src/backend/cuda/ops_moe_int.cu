// moe_routed_experts_int (ops_moe.h): the integer-form GPTQ experts (moe_int_arith.h). Checks the
// shapes the form covers and sends a step to the dp4a kernels (<= moe_int_decode_max_tokens()
// tokens, ops_moe_int_decode.cu) or the tensor-core kernels (ops_moe_int_mma.cu); both give a
// token the same bits, so the choice is only about speed.
#include <atomic>
#include <string>

#include "backend/cuda/ops_moe_int_internal.cuh"
#include "core/error.h"

namespace moeserve::cuda {

namespace moe_int_detail {

bool int_form_supported(const MoeShape& s, const DeviceExperts& ex) {
  if (ex.format != quant::WeightFormat::GptqInt4) return false;
  const DeviceLinear* p[] = {&ex.gate, &ex.up, &ex.down};
  for (const DeviceLinear* d : p)
    // Units of >= 32 k (the tensor-core kernels' k32 steps); a group that tiles its K.
    if (d->g_idx.size() != 0 || moe_int::unit_length(int(d->group_size)) < 32 || d->K % d->group_size != 0)
      return false;
  if (ex.gate.group_size != ex.up.group_size || ex.gate.sym != ex.up.sym) return false;
  // The last activation block of a row may be short; units must tile K (moe_int_arith.h 1., 2.).
  if (s.hidden % moe_int::kKStep != 0 || s.intermediate % moe_int::kKStep != 0) return false;
  if (s.hidden % moe_int::unit_length(int(ex.gate.group_size)) != 0 ||
      s.intermediate % moe_int::unit_length(int(ex.down.group_size)) != 0)
    return false;
  if (s.top_k < 1 || s.top_k > 32 || s.num_experts < 1 || s.num_experts > 256) return false;
  return int(ex.gate.K) == s.hidden && int(ex.gate.N) == s.intermediate && int(ex.down.K) == s.intermediate &&
         int(ex.down.N) == s.hidden;
}

}  // namespace moe_int_detail

namespace {
std::atomic<int> g_int_decode_max{moe_int_detail::kIntDecodeMaxTokens};
}  // namespace

void set_moe_int_decode_max_tokens(int max_tokens) {
  if (max_tokens < 0 || max_tokens > moe_int_detail::kIntDecodeMaxTokens)
    throw Error("set_moe_int_decode_max_tokens: " + std::to_string(max_tokens) + " (0 .. " +
                std::to_string(moe_int_detail::kIntDecodeMaxTokens) + ")");
  g_int_decode_max.store(max_tokens);
}

int moe_int_decode_max_tokens() { return g_int_decode_max.load(); }

bool moe_int_supported(const MoeShape& shape, const DeviceExperts& experts) {
  return moe_int_detail::int_form_supported(shape, experts);
}

size_t moe_int_workspace_bytes(const MoeShape& shape, int max_tokens) {
  const size_t a = moe_int_detail::int_mma_workspace_bytes(shape, max_tokens);
  const int d = max_tokens < moe_int_detail::kIntDecodeMaxTokens ? max_tokens : moe_int_detail::kIntDecodeMaxTokens;
  const size_t b = moe_int_detail::int_decode_workspace_bytes(shape, d);
  return a > b ? a : b;
}

bool moe_routed_experts_int(const float* x, const float* router_logits, const MoeShape& shape,
                            const DeviceExperts& experts, int M, void* workspace, size_t workspace_bytes,
                            float* residual, cudaStream_t stream, const float* shared_out,
                            const float* shared_gate_logit, cudaEvent_t shared_ready) {
  if (!moe_int_detail::int_form_supported(shape, experts)) return false;
  if (M <= 0) return true;
  if (M <= moe_int_decode_max_tokens()) {
    if (workspace_bytes < moe_int_detail::int_decode_workspace_bytes(shape, M))
      throw Error("moe_routed_experts_int: workspace too small for " + std::to_string(M) + " tokens");
    moe_int_detail::int_decode(x, router_logits, shape, experts, M, workspace, workspace_bytes, residual, shared_out,
                               shared_gate_logit, stream, shared_ready);
  } else {
    if (workspace_bytes < moe_int_detail::int_mma_workspace_bytes(shape, M))
      throw Error("moe_routed_experts_int: workspace too small for " + std::to_string(M) + " tokens");
    moe_int_detail::int_mma(x, router_logits, shape, experts, M, workspace, workspace_bytes, residual, shared_out,
                            shared_gate_logit, stream, shared_ready);
  }
  return true;
}

}  // namespace moeserve::cuda
