// `moeserve convert SRC DST`: rewrites a Qwen3.5-MoE checkpoint directory, streaming.
//
//   --weights gptq-int4 [--modules REGEX] [--group-size 128]   BF16 -> AutoRound/GPTQ INT4 (RTN, symmetric)
//   --weights fp8-block [--modules REGEX]                      BF16 -> FP8 E4M3, 128 x 128 block scales
//   --weights hybrid-int4-fp8                                   INT4 routed experts, FP8 attention /
//                                                               DeltaNet projections / shared expert
//   --hybrid-experts-from INT4_DIR --hybrid-dense-from FP8_DIR  a hybrid from two donors (only DST given)
//   --add-mtp-from DIR                                          copy the MTP block from another checkpoint
//   --max-shard-size 5GB                                        re-shard (alone: a bit-exact re-shard)
//
// What is quantised by default (also the MTP layer's modules): routed experts, attention
// q/k/v/o, DeltaNet in_proj_qkv/in_proj_z/out_proj, shared expert gate/up/down. Kept as stored
// (BF16), as the published FP8 release keeps them: embeddings, lm_head, norms, router (mlp.gate),
// shared_expert_gate, in_proj_a/b, conv1d, A_log, dt_bias, mtp.fc. Non-weight files (tokenizer,
// chat template, generation config, ...) are copied; config.json gets the quantization_config of
// what was written (tools/convert_config.h). The output appears atomically (convert_output_dir.h).
// docs/TOOLS.md has examples.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "tools/progress_bar.h"

namespace moeserve::tools {

struct ConvertOptions {
  std::filesystem::path src;                  // empty when building a hybrid from donors
  std::filesystem::path dst;
  std::string weights = "keep";               // keep | gptq-int4 | fp8-block | hybrid-int4-fp8
  std::optional<std::string> modules;         // regex over canonical module names
  int64_t group_size = 128;
  std::filesystem::path hybrid_experts_from;  // INT4 checkpoint: routed experts
  std::filesystem::path hybrid_dense_from;    // FP8 checkpoint: everything else
  std::filesystem::path add_mtp_from;
  std::string max_shard_size = "5GB";
  bool force = false;                         // replace an existing DST
  int threads = 0;                            // 0: all cores
  ProgressBar::Mode progress = ProgressBar::Mode::Auto;
};

struct ConvertSummary {
  int64_t int4_modules = 0, fp8_modules = 0, dense_modules = 0;
  int64_t fused_tensors_split = 0;
  int64_t tensors_written = 0;
  int64_t shards = 0;
  uint64_t source_bytes = 0, output_bytes = 0;
  double seconds = 0;
};

// Runs the conversion; throws moeserve::Error (DST untouched) on any problem.
ConvertSummary run_convert(const ConvertOptions& options);

}  // namespace moeserve::tools
