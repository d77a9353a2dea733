#include "model/qwen35_cpu.h"

#include <set>

#include "backend/cpu/norms.h"
#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "model/mtp.h"
#include "model/step_rows.h"

namespace moeserve::model {

namespace {

cpu::KvGeometry kv_geometry(const io::Qwen35Config& c, int block_size) {
  return {c.num_key_value_heads, c.head_dim, block_size};
}

cpu::GdnGeometry gdn_geometry(const io::Qwen35Config& c) {
  return {c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim,
          c.linear_conv_kernel_dim};
}

}  // namespace

Qwen35CpuModel::Qwen35CpuModel(io::Qwen35Config config, Qwen35Weights weights, const CpuModelOptions& options)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      kv_block_size_(options.kv_block_size),
      pool_(options.threads),
      rope_(config_.rotary_dim(), config_.rope_theta) {
  MOESERVE_CHECK(kv_block_size_ > 0, "KV block size must be positive, got {}", kv_block_size_);
  MOESERVE_CHECK(weights_.layers.size() == size_t(config_.num_hidden_layers),
                 "weights have {} layers, config {}", weights_.layers.size(), config_.num_hidden_layers);
  int full = 0, linear = 0;
  for (const auto& layer : weights_.layers)
    cache_index_.push_back(layer.type == io::LayerType::FullAttention ? full++ : linear++);
}

std::unique_ptr<Qwen35CpuModel> Qwen35CpuModel::load(const std::filesystem::path& model_dir,
                                                     const CpuModelOptions& options) {
  io::Qwen35Config config = io::load_qwen35_config(model_dir);
  const io::Checkpoint ckpt = io::Checkpoint::open(model_dir);
  Qwen35Weights weights =
      load_qwen35_weights(ckpt, config, WeightLoadOptions{options.load_mtp, options.int8_lm_head});
  log::info("loaded {}: {} layers ({} full attention), {} experts top-{}, MTP {}", model_dir.string(),
            config.num_hidden_layers, config.num_full_attention_layers(), config.num_experts,
            config.num_experts_per_tok, weights.mtp ? "yes" : "no");
  return std::make_unique<Qwen35CpuModel>(std::move(config), std::move(weights), options);
}

int Qwen35CpuModel::num_kv_layers() const { return config_.num_full_attention_layers() + (has_mtp() ? 1 : 0); }

CacheGeometry Qwen35CpuModel::cache_geometry() const {
  CacheGeometry g;
  g.kv_block_size = kv_block_size_;
  g.bytes_per_kv_block =
      size_t(num_kv_layers()) * cpu::PagedKvCache::bytes_per_block(kv_geometry(config_, kv_block_size_));
  const auto gdn = gdn_geometry(config_);
  g.bytes_per_state_slot = size_t(config_.num_linear_attention_layers()) *
                           size_t(gdn.conv_state_size() + gdn.recurrent_state_size()) * sizeof(float);
  return g;
}

void Qwen35CpuModel::allocate_caches(int num_kv_blocks, int num_state_slots) {
  caches_.allocate(kv_geometry(config_, kv_block_size_), num_kv_layers(), num_kv_blocks, gdn_geometry(config_),
                   config_.num_linear_attention_layers(), num_state_slots);
}

void Qwen35CpuModel::reset_state(int32_t slot) { caches_.reset_state(slot); }

void Qwen35CpuModel::copy_state(int32_t src, int32_t dst) { caches_.copy_state(src, dst); }

LayerCaches Qwen35CpuModel::caches_of_layer(size_t layer) {
  const int index = cache_index_[layer];
  if (weights_.layers[layer].type == io::LayerType::FullAttention) return {&caches_.kv(index), nullptr};
  return {nullptr, &caches_.gdn(index)};
}

StepRows Qwen35CpuModel::plan_step(std::span<const SeqStep> batch, std::vector<int32_t>& tokens) {
  // The whole batch is validated before any cache is touched.
  const int64_t V = config_.vocab_size;
  const bool has_full = config_.num_full_attention_layers() > 0;
  const bool has_linear = config_.num_linear_attention_layers() > 0;
  StepRows rows;
  std::set<int32_t> slots;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqStep& s = batch[i];
    MOESERVE_CHECK(!s.tokens.empty(), "sequence {} of the step has no tokens", i);
    MOESERVE_CHECK(s.start_pos >= 0, "sequence {}: negative start position {}", i, s.start_pos);
    for (int32_t t : s.tokens)
      MOESERVE_CHECK(t >= 0 && t < V, "sequence {}: token id {} is outside the vocabulary [0, {})", i, t, V);
    if (has_full) caches_.kv(0).check_block_table(s.kv_blocks, s.start_pos + int64_t(s.tokens.size()));
    if (has_linear) {
      caches_.check_slot(s.state_slot);
      MOESERVE_CHECK(slots.insert(s.state_slot).second, "state slot {} is used by two sequences of one step",
                     s.state_slot);
    }
    rows.add(int64_t(s.tokens.size()), s.start_pos, s.kv_blocks, s.state_slot);
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
  }
  return rows;
}

void Qwen35CpuModel::forward(std::span<const SeqStep> batch, StepOutput& out) {
  const int64_t H = config_.hidden_size;
  const float eps = float(config_.rms_norm_eps);
  std::vector<int32_t> tokens;
  const StepRows rows = plan_step(batch, tokens);
  std::vector<uint8_t> all_logits;
  for (const SeqStep& s : batch) all_logits.push_back(s.all_logits ? 1 : 0);

  // Section 2.2: h = Embed[token]; per layer h += mixer(norm(h)), h += MoE(norm(h)).
  std::vector<float> h(size_t(rows.rows * H));
  embed_rows(pool_, weights_.embed_tokens, tokens, h.data());
  const StepContext ctx{pool_, config_, rope_, rows.seqs, rows.positions, rows.rows};
  for (size_t l = 0; l < weights_.layers.size(); ++l)
    decoder_layer(ctx, weights_.layers[l], caches_of_layer(l), h.data());

  // logits = lm_head · RMSNorm_final(h), for the rows the caller asked for.
  out.vocab = config_.vocab_size;
  out.hidden_size = H;
  const auto selected = select_output_rows(rows, all_logits, out.first_row, out.num_rows);
  std::vector<float> normed;
  norm_and_project(pool_, h.data(), H, selected, weights_.final_norm, eps, weights_.lm_head, normed, out.logits);
  if (out.want_hidden) {
    out.hidden.resize(size_t(rows.rows * H));
    cpu::rms_norm_zero_centred_rows(pool_, h.data(), out.hidden.data(), rows.rows, H, weights_.final_norm.data(), eps);
  } else {
    out.hidden.clear();
  }
}

void Qwen35CpuModel::mtp_forward(std::span<const MtpStep> batch, MtpOutput& out) {
  MOESERVE_CHECK(has_mtp(), "this model has no MTP weights");
  run_mtp(MtpContext{pool_, config_, rope_, weights_, caches_.kv(config_.num_full_attention_layers())}, batch, out);
}

}  // namespace moeserve::model
