// moeserve bench: benchmark client for any OpenAI-compatible server (src/tools/bench.h).
#include <memory>

#include "cli/command.h"
#include "tools/bench.h"

namespace {

moeserve::cli::Registrar reg{
    "bench", "Benchmark an OpenAI-compatible server: latency/throughput under load, or the spark5 suite",
    [](CLI::App& app) {
      auto o = std::make_shared<moeserve::tools::BenchOptions>();
      app.add_option("--base-url", o->base_url, "Server URL (a trailing /v1 is accepted)")->capture_default_str();
      app.add_option("--api-key", o->api_key, "Sent as 'Authorization: Bearer KEY'");
      app.add_option("--model", o->model, "Model name (default: the first of GET /v1/models)");
      app.add_option("--endpoint", o->endpoint, "chat (/v1/chat/completions) or completions (/v1/completions)")
          ->check(CLI::IsMember({"chat", "completions"}))
          ->capture_default_str();
      app.add_option("--timeout", o->timeout_s, "Connect and per-read timeout, seconds")->capture_default_str();

      app.add_option("--suite", o->suite,
                     "Run a fixed suite instead of load mode: spark5 (the reference project's 5 prompts, "
                     "non-streaming, tok/s = completion_tokens / request time)")
          ->check(CLI::IsMember({"spark5"}));
      app.add_option("--runs", o->runs, "spark5: measured passes after the warm-up pass")->capture_default_str();
      app.add_flag("--no-warmup", o->no_warmup, "spark5: skip the discarded warm-up pass");

      app.add_option("--num-prompts", o->num_prompts, "Requests to send")->capture_default_str();
      app.add_option("--concurrency,--max-concurrency", o->concurrency,
                     "Most requests in flight (0: no limit)")
          ->capture_default_str();
      app.add_option("--request-rate", o->request_rate, "Requests per second, Poisson arrivals (inf: all at once)")
          ->capture_default_str();
      app.add_option("--burstiness", o->burstiness, "Gamma shape of the arrival gaps (1: Poisson)")
          ->capture_default_str();
      app.add_option("--seed", o->seed, "Seed for random prompts and arrival times")->capture_default_str();
      app.add_option("--input-len", o->input_len, "Random prompts: tokens per prompt")->capture_default_str();
      app.add_option("--output-len", o->output_len, "max_tokens per request (datasets may override)")
          ->capture_default_str();
      app.add_option("--random-range-ratio", o->range_ratio,
                     "Random prompts: lengths uniform in [len*(1-r), len*(1+r)]")
          ->capture_default_str();
      app.add_flag("--random-ids", o->random_ids, "Random prompts as token-id lists (completions endpoint)");
      app.add_option("--dataset", o->dataset, "JSONL file: {\"prompt\": ...} or {\"messages\": [...]} per line")
          ->check(CLI::ExistingFile);
      app.add_option("--temperature", o->temperature, "Sampling temperature")->capture_default_str();
      app.add_flag("--ignore-eos", o->ignore_eos, "Ask the server to generate exactly max_tokens (ignore_eos)");
      app.add_option("--extra-body", o->extra_body, "JSON object merged into every request body");
      app.add_option("--metric-percentiles", o->percentiles, "Percentiles to report, e.g. 50,90,99")
          ->capture_default_str();
      app.add_option("--goodput", o->goodput, "Service-level objectives in ms: ttft:MS tpot:MS e2el:MS");
      app.add_option("--warmup-requests", o->warmup_requests, "Unmeasured requests sent first")
          ->capture_default_str();
      app.add_option("--output-json", o->output_json, "Write the results to this JSON file");
      app.add_flag("--no-progress", o->no_progress, "No progress bar (it is drawn only on a terminal anyway)");
      return [o] { return moeserve::tools::run_bench(*o); };
    }};

}  // namespace
