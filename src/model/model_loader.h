// Opens a model directory on a device: the one entry point for commands that run a model
// (score, generate, serve, perplexity).
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "model/causal_lm.h"

namespace moeserve::model {

struct ModelLoadOptions {
  std::string device = "cpu";  // "cpu"; "cuda" once a CUDA CausalLM exists
  int threads = 0;             // CPU threads; <= 0: all hardware threads
  int kv_block_size = 16;
  bool load_mtp = true;
};

// Throws moeserve::Error for an unknown or unavailable device and for any bad file.
std::unique_ptr<CausalLM> load_causal_lm(const std::filesystem::path& model_dir, const ModelLoadOptions& options);

}  // namespace moeserve::model
