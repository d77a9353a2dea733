// The flags every model-running subcommand shares (score, generate, serve, ...).
#pragma once
#include <CLI/CLI.hpp>

#include "model/model_loader.h"

namespace moeserve::cli {

inline void add_model_load_flags(CLI::App& app, model::ModelLoadOptions& o) {
  o.device = "auto";
  app.add_option("--device", o.device, "cpu, cuda, or auto (cuda when a GPU is present)")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0: all)")->capture_default_str();
  app.add_option("--load-format", o.load_format, "auto | safetensors | dummy (random weights of config.json, CUDA)")
      ->capture_default_str();
  app.add_option("--dummy-weights", o.dummy_weights,
                 "with --load-format dummy: bf16 | gptq-int4 | fp8-block | hybrid-int4-fp8")
      ->capture_default_str();
  app.add_flag("--int8-lm-head", o.int8_lm_head, "quantise the LM head to INT8 row-wise at load (per-row scale max|w|/127)");
}

}  // namespace moeserve::cli
