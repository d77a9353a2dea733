// The process-wide L2 policy of the decode kernels' weight streams (l2_policy.cuh says why): the
// one/two-token and token-tile row GEMVs (ops_quant_gemv_multi.cu: dense projections, the router
// and shared expert, the LM head) and the integer-form streaming expert kernels
// (ops_moe_int_stream.cu). Read at launch time into the kernels' arguments, so a graph captured
// after a change keeps the policy it was captured with. The same bits under either policy.
#pragma once
#include <string>

namespace moeserve::cuda {

enum class WeightL2Policy { Normal = 0, EvictFirst = 1 };

void set_weight_l2_policy(WeightL2Policy policy);
WeightL2Policy weight_l2_policy();
// "normal" or "evict-first"; throws core Error on anything else.
WeightL2Policy parse_weight_l2_policy(const std::string& name);
// The launch argument: 1 for EvictFirst, else 0.
inline int weight_l2_evict_first_arg() { return weight_l2_policy() == WeightL2Policy::EvictFirst ? 1 : 0; }

}  // namespace moeserve::cuda
