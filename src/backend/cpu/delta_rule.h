// The gated delta rule of one GDN value head (../shared/spec/qwen35_arch.md section 2.5,
// steps 7 and 8), fp32. Two mathematically identical forms:
//   recurrent: one token at a time (decode);
//   chunked:   64 tokens at a time with a triangular solve (prefill), as HF's
//              torch_chunk_gated_delta_rule and FLA compute it.
// Inputs are already prepared: q = l2norm(q)/sqrt(dk), k = l2norm(k), β = sigmoid(b),
// g = −exp(A_log)·softplus(α + dt_bias).
#pragma once
#include <cstdint>

namespace moeserve::cpu {

struct DeltaRuleSequence {
  int64_t num_tokens = 0;
  int64_t dk = 0, dv = 0;
  const float* q = nullptr;     // row t at q + t·ld_qk, dk values
  const float* k = nullptr;     // row t at k + t·ld_qk
  int64_t ld_qk = 0;
  const float* v = nullptr;     // row t at v + t·ld_v, dv values
  int64_t ld_v = 0;
  const float* g = nullptr;     // g_t at g[t·ld_gate]
  const float* beta = nullptr;  // β_t at beta[t·ld_gate]
  int64_t ld_gate = 0;
  float* out = nullptr;         // o_t at out + t·ld_out, dv values
  int64_t ld_out = 0;
};

// For each t: S ← e^{g_t} S;  Δ = β_t (v_t − Sᵀk_t);  S ← S + k_t ⊗ Δ;  o_t = Sᵀ q_t.
// state: S [dk][dv], read and updated in place.
void delta_rule_recurrent(const DeltaRuleSequence& seq, float* state);

// The chunked form (section 2.5 step 8) with chunks of `chunk_size` tokens; the last chunk
// may be shorter (equivalent to HF's zero padding). Same state contract as above.
void delta_rule_chunked(const DeltaRuleSequence& seq, float* state, int64_t chunk_size = 64);

}  // namespace moeserve::cpu
