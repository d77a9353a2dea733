// moeserve generate: one-shot generation from token ids, for scripts and smoke tests.
//   moeserve generate MODEL_DIR --prompt-ids 1,2,3 --max-tokens N --temperature 0
// prints {"token_ids": [...]} (the generated ids only) as its last stdout line. Greedy at
// temperature 0; otherwise samples with --top-p/--top-k from --seed. Stops after
// --max-tokens or at an eos id of the model config (unless --ignore-eos).
#include <chrono>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "model/model_loader.h"
#include "model/sequence_runner.h"
#include "runtime/rng.h"
#include "runtime/sampler.h"

namespace {

struct GenerateOptions {
  std::string model_dir;
  std::vector<int32_t> prompt_ids;
  int max_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = -1;
  uint64_t seed = 0;
  bool ignore_eos = false;
  int64_t chunk_size = 512;
  moeserve::model::ModelLoadOptions load;
};

int run_generate(const GenerateOptions& o) {
  using Clock = std::chrono::steady_clock;
  namespace runtime = moeserve::runtime;
  MOESERVE_CHECK(!o.prompt_ids.empty(), "--prompt-ids: give at least one token id");
  MOESERVE_CHECK(o.max_tokens >= 1, "--max-tokens must be at least 1, got {}", o.max_tokens);
  MOESERVE_CHECK(o.temperature >= 0, "--temperature must not be negative, got {}", o.temperature);
  MOESERVE_CHECK(o.top_p > 0 && o.top_p <= 1, "--top-p must be in (0, 1], got {}", o.top_p);
  MOESERVE_CHECK(o.chunk_size > 0, "--chunk-size must be positive, got {}", o.chunk_size);
  auto model = moeserve::model::load_causal_lm(o.model_dir, o.load);
  const auto& eos = model->config().eos_token_ids;

  runtime::SamplingParams params;
  params.temperature = o.temperature;
  params.top_p = o.top_p;
  params.top_k = o.top_k;
  params.seed = o.seed;
  params.ignore_eos = o.ignore_eos;
  params.max_tokens = o.max_tokens;
  runtime::TokenHistory history;
  history.set_prompt(o.prompt_ids);
  runtime::Rng rng(o.seed);
  runtime::Sampler sampler;

  moeserve::model::SequenceRunner runner(*model, int64_t(o.prompt_ids.size()) + o.max_tokens);
  runner.set_prompt_length(int64_t(o.prompt_ids.size()));
  const auto t0 = Clock::now();
  std::vector<float> logits = runner.append(o.prompt_ids, o.chunk_size, false);
  const auto t1 = Clock::now();
  std::vector<int32_t> generated;
  while (true) {
    const runtime::SampleInput in{logits, &params, &history, int(generated.size()), eos, &rng};
    const int32_t token = sampler.sample(in).token;
    generated.push_back(token);
    history.add_output(token);
    const bool is_eos = std::find(eos.begin(), eos.end(), int64_t(token)) != eos.end();
    if (int(generated.size()) >= o.max_tokens || (is_eos && !o.ignore_eos)) break;
    logits = runner.append(std::span(&token, 1), 1, false);
  }
  const auto t2 = Clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  moeserve::log::info("prefill {} tokens in {:.3f} s ({:.1f} tok/s); {} tokens generated in {:.3f} s",
                      o.prompt_ids.size(), prefill_s, double(o.prompt_ids.size()) / prefill_s, generated.size(),
                      decode_s);
  std::cout << nlohmann::json{{"token_ids", generated}}.dump() << std::endl;
  return 0;
}

moeserve::cli::Registrar reg{"generate", "Generate tokens from prompt token ids", [](CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  app.add_option("model_dir", o->model_dir, "Model directory (config.json + safetensors)")->required();
  app.add_option("--prompt-ids", o->prompt_ids, "Comma-separated prompt token ids")->required()->delimiter(',');
  app.add_option("--max-tokens", o->max_tokens, "Most tokens to generate")->capture_default_str();
  app.add_option("--temperature", o->temperature, "0: greedy")->capture_default_str();
  app.add_option("--top-p", o->top_p, "Nucleus sampling mass, (0, 1]")->capture_default_str();
  app.add_option("--top-k", o->top_k, "Keep the k most likely tokens (-1: off)")->capture_default_str();
  app.add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  app.add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the model's eos tokens");
  app.add_option("--chunk-size", o->chunk_size, "Prefill chunk, tokens per forward")->capture_default_str();
  moeserve::cli::add_model_load_flags(app, o->load);
  return [o] { return run_generate(*o); };
}};

}  // namespace
