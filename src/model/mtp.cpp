#include "model/mtp.h"

#include "backend/cpu/linear.h"
#include "backend/cpu/norms.h"
#include "core/error.h"
#include "model/step_rows.h"

namespace moeserve::model {

void run_mtp(const MtpContext& ctx, std::span<const MtpStep> batch, MtpOutput& out) {
  MOESERVE_CHECK(ctx.weights.mtp.has_value(), "this model has no MTP weights");
  const MtpWeights& w = *ctx.weights.mtp;
  const auto& cfg = ctx.config;
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  const float eps = float(cfg.rms_norm_eps);

  StepRows rows;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> all_logits;
  for (size_t i = 0; i < batch.size(); ++i) {
    const MtpStep& s = batch[i];
    const int64_t n = int64_t(s.next_tokens.size());
    MOESERVE_CHECK(n > 0, "MTP sequence {} has no rows", i);
    MOESERVE_CHECK(int64_t(s.hidden.size()) == n * H, "MTP sequence {}: {} hidden values for {} rows of {}", i,
                   s.hidden.size(), n, H);
    MOESERVE_CHECK(s.start_pos >= 0, "MTP sequence {}: negative start position {}", i, s.start_pos);
    for (int32_t t : s.next_tokens)
      MOESERVE_CHECK(t >= 0 && t < V, "MTP sequence {}: token id {} is outside the vocabulary [0, {})", i, t, V);
    ctx.kv.check_block_table(s.kv_blocks, s.start_pos + n);
    rows.add(n, s.start_pos, s.kv_blocks, -1);
    tokens.insert(tokens.end(), s.next_tokens.begin(), s.next_tokens.end());
    all_logits.push_back(s.all_logits ? 1 : 0);
  }
  const int64_t R = rows.rows;

  // x = fc · [RMSNorm_e(embed(t_{p+1})) ; RMSNorm_h(h_p)] per row.
  std::vector<float> hidden_in;
  hidden_in.reserve(size_t(R * H));
  for (const MtpStep& s : batch) hidden_in.insert(hidden_in.end(), s.hidden.begin(), s.hidden.end());
  std::vector<float> e(size_t(R * H)), cat(size_t(R * 2 * H)), x(size_t(R * H));
  embed_rows(ctx.pool, ctx.weights.embed_tokens, tokens, e.data());
  ctx.pool.parallel_for(R, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* dst = cat.data() + r * 2 * H;
      cpu::rms_norm_zero_centred(e.data() + r * H, dst, H, w.pre_fc_norm_embedding.data(), eps);
      cpu::rms_norm_zero_centred(hidden_in.data() + r * H, dst + H, H, w.pre_fc_norm_hidden.data(), eps);
    }
  }, 16);
  cpu::linear(ctx.pool, cat.data(), R, w.fc, x.data());

  // The decoder layer at positions p, then the MTP norm and the shared head.
  const StepContext step{ctx.pool, cfg, ctx.rope, rows.seqs, rows.positions, R};
  decoder_layer(step, w.layer, LayerCaches{&ctx.kv, nullptr}, x.data());
  const auto selected = select_output_rows(rows, all_logits, out.first_row, out.num_rows);
  norm_and_project(ctx.pool, x.data(), H, selected, w.norm, eps, ctx.weights.lm_head, out.hidden, out.logits);
  out.vocab = V;
  out.hidden_size = H;
}

}  // namespace moeserve::model
