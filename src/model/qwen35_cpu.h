// The CPU reference implementation of CausalLM for Qwen3.5 MoE: fp32 math over exactly
// dequantised weights, threaded, with results independent of the thread count.
// The forward pass is ../shared/spec/qwen35_arch.md section 2.2 (see docs/MODEL.md).
#pragma once
#include <filesystem>
#include <memory>

#include "backend/cpu/rope.h"
#include "core/thread_pool.h"
#include "model/causal_lm.h"
#include "model/qwen35_cache.h"
#include "model/qwen35_layers.h"
#include "model/step_rows.h"
#include "model/qwen35_weights.h"

namespace moeserve::model {

struct CpuModelOptions {
  int threads = 0;         // <= 0: all hardware threads
  int kv_block_size = 16;  // tokens per KV block
  bool load_mtp = true;    // load the MTP block when the checkpoint has one
  bool int8_lm_head = false;  // --int8-lm-head: the LM head quantised to INT8 row-wise at load
};

class Qwen35CpuModel final : public CausalLM {
 public:
  Qwen35CpuModel(io::Qwen35Config config, Qwen35Weights weights, const CpuModelOptions& options);
  // Reads config.json and the checkpoint in model_dir.
  static std::unique_ptr<Qwen35CpuModel> load(const std::filesystem::path& model_dir,
                                              const CpuModelOptions& options = {});

  const io::Qwen35Config& config() const override { return config_; }
  CacheGeometry cache_geometry() const override;
  void allocate_caches(int num_kv_blocks, int num_state_slots) override;
  void reset_state(int32_t slot) override;
  void copy_state(int32_t src, int32_t dst) override;
  void forward(std::span<const SeqStep> batch, StepOutput& out) override;

  bool has_mtp() const override { return weights_.mtp.has_value(); }
  void mtp_forward(std::span<const MtpStep> batch, MtpOutput& out) override;

  const Qwen35Weights& weights() const { return weights_; }
  int num_threads() const { return pool_.size(); }

 private:
  // Validates a step (tokens, positions, block tables, state slots) and lays out its rows;
  // appends every new token to `tokens`.
  StepRows plan_step(std::span<const SeqStep> batch, std::vector<int32_t>& tokens);
  LayerCaches caches_of_layer(size_t layer);
  int num_kv_layers() const;

  io::Qwen35Config config_;
  Qwen35Weights weights_;
  int kv_block_size_;
  ThreadPool pool_;
  cpu::RotaryEmbedding rope_;
  ModelCaches caches_;
  std::vector<int> cache_index_;  // per layer: its KV pool or its GDN slot array
};

}  // namespace moeserve::model
