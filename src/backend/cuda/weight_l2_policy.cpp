// The weight streams' L2 policy switch (weight_l2_policy.h).
#include "backend/cuda/weight_l2_policy.h"

#include <atomic>

#include "core/error.h"

namespace moeserve::cuda {
namespace {
std::atomic<int> g_policy{int(WeightL2Policy::Normal)};
}  // namespace

void set_weight_l2_policy(WeightL2Policy policy) { g_policy.store(int(policy), std::memory_order_relaxed); }

WeightL2Policy weight_l2_policy() { return WeightL2Policy(g_policy.load(std::memory_order_relaxed)); }

WeightL2Policy parse_weight_l2_policy(const std::string& name) {
  if (name == "normal") return WeightL2Policy::Normal;
  if (name == "evict-first") return WeightL2Policy::EvictFirst;
  throw Error("unknown weight L2 policy '" + name + "' (normal, evict-first)");
}

}  // namespace moeserve::cuda
