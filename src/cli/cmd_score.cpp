// moeserve score: teacher-forced logits of a token sequence, for tests and evaluations.
//   moeserve score MODEL_DIR --token-ids 1,2,3 --output logits.json [--chunk-size N]
// writes {"logits": [[v_0 ... v_{V-1}], ...]}: one fp32 row per input position, the row of
// position p predicting token p + 1. Prefill runs in chunks of --chunk-size tokens.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "cli/command.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "model/model_loader.h"
#include "model/sequence_runner.h"

namespace {

struct ScoreOptions {
  std::string model_dir;
  std::vector<int32_t> token_ids;
  std::string output;
  int64_t chunk_size = 512;
  moeserve::model::ModelLoadOptions load;
};

void write_logits_json(const std::string& path, const std::vector<float>& logits, int64_t rows, int64_t vocab) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  MOESERVE_CHECK(f.good(), "--output {}: cannot open for writing", path);
  fmt::memory_buffer buf;
  buf.append(std::string_view("{\"logits\": ["));
  for (int64_t r = 0; r < rows; ++r) {
    buf.append(std::string_view(r ? ",\n[" : "\n["));
    for (int64_t v = 0; v < vocab; ++v) {
      const float x = logits[size_t(r * vocab + v)];
      MOESERVE_CHECK(std::isfinite(x), "logit {} of position {} is not finite ({})", v, r, x);
      if (v) buf.push_back(',');
      fmt::format_to(std::back_inserter(buf), "{}", x);  // the shortest form that reads back exactly
    }
    buf.push_back(']');
    if (buf.size() > (1 << 22)) {
      f.write(buf.data(), std::streamsize(buf.size()));
      buf.clear();
    }
  }
  buf.append(std::string_view("\n]}\n"));
  f.write(buf.data(), std::streamsize(buf.size()));
  f.close();
  MOESERVE_CHECK(!f.fail(), "--output {}: write failed", path);
}

int run_score(const ScoreOptions& o) {
  MOESERVE_CHECK(!o.token_ids.empty(), "--token-ids: give at least one token id");
  MOESERVE_CHECK(o.chunk_size > 0, "--chunk-size must be positive, got {}", o.chunk_size);
  auto model = moeserve::model::load_causal_lm(o.model_dir, o.load);
  moeserve::model::SequenceRunner runner(*model, int64_t(o.token_ids.size()));
  const auto logits = runner.append(o.token_ids, o.chunk_size, true);
  write_logits_json(o.output, logits, int64_t(o.token_ids.size()), model->config().vocab_size);
  moeserve::log::info("wrote logits of {} positions to {}", o.token_ids.size(), o.output);
  return 0;
}

moeserve::cli::Registrar reg{"score", "Teacher-forced logits of a token sequence (JSON)", [](CLI::App& app) {
  auto o = std::make_shared<ScoreOptions>();
  app.add_option("model_dir", o->model_dir, "Model directory (config.json + safetensors)")->required();
  app.add_option("--token-ids", o->token_ids, "Comma-separated token ids")->required()->delimiter(',');
  app.add_option("--output", o->output, "Where to write {\"logits\": [[...], ...]}")->required();
  app.add_option("--chunk-size", o->chunk_size, "Prefill chunk, tokens per forward")->capture_default_str();
  moeserve::cli::add_model_load_flags(app, o->load);
  return [o] { return run_score(*o); };
}};

}  // namespace
