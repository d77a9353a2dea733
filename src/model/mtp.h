// The multi-token-prediction block on the CPU (../shared/spec/qwen35_arch.md sections 3.3-3.4):
//   e = Embed(t_{p+1});  x = fc · [RMSNorm_e(e) ; RMSNorm_h(h_p)]   (embedding first)
//   x = one full-attention MoE decoder layer at position p (its own paged K/V)
//   g = RMSNorm_mtp(x);  draft logits = lm_head · g (shared with the main model)
// g is also returned: it is the hidden input of the next draft step.
#pragma once
#include <span>

#include "backend/cpu/paged_kv_cache.h"
#include "backend/cpu/rope.h"
#include "core/thread_pool.h"
#include "io/qwen35_config.h"
#include "model/causal_lm.h"
#include "model/qwen35_weights.h"

namespace moeserve::model {

struct MtpContext {
  ThreadPool& pool;
  const io::Qwen35Config& config;
  const cpu::RotaryEmbedding& rope;
  const Qwen35Weights& weights;  // weights.mtp must be set
  cpu::PagedKvCache& kv;         // the MTP layer's K/V pool
};

void run_mtp(const MtpContext& ctx, std::span<const MtpStep> batch, MtpOutput& out);

}  // namespace moeserve::model
