#include "tools/bench_spark5.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/bench_report.h"
#include "tools/bench_stats.h"

namespace moeserve::tools {

using json = nlohmann::json;

const std::vector<Spark5Prompt>& spark5_prompts() {
  static const std::vector<Spark5Prompt> prompts = {
      {"Q&A", "What are the main differences between TCP and UDP? Be concise.", 256},
      {"Code",
       "Write a Python function that implements binary search on a sorted list. Include type hints and "
       "docstring.",
       512},
      {"JSON",
       "Generate a JSON array of 10 fictional employees with fields: name, age, department, salary, email, "
       "skills (array of 3). Output ONLY valid JSON, no explanation.",
       1024},
      {"Math", "What is 7823 * 4519? Show only the answer.", 64},
      {"LongCode",
       "Write a complete Python implementation of a red-black tree with insert, delete, search, and in-order "
       "traversal. Include all rotation methods.",
       2048},
  };
  return prompts;
}

bool parse_spec_decode_counters(const std::string& metrics_text, double& drafts, double& accepted) {
  drafts = accepted = 0;
  bool found = false;
  std::istringstream in(metrics_text);
  std::string line;
  auto ends_with = [](const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) continue;
    const std::string name = line.substr(0, name_end);
    const auto value_start = line.find_last_of(' ');
    double value = 0;
    try {
      value = std::stod(line.substr(value_start + 1));
    } catch (const std::exception&) {
      continue;
    }
    if (ends_with(name, "spec_decode_num_drafts_total")) {
      drafts += value;
      found = true;
    } else if (ends_with(name, "spec_decode_num_accepted_tokens_total")) {
      accepted += value;
      found = true;
    }
  }
  return found;
}

void summarize_spark5(Spark5Result& result) {
  result.prompts.clear();
  result.failures = 0;
  std::vector<double> means;
  for (const auto& p : spark5_prompts()) {
    Spark5PromptSummary s;
    s.name = p.name;
    s.max_tokens = p.max_tokens;
    std::vector<double> rates, prompt_toks, completion_toks;
    for (const auto& sample : result.samples) {
      if (sample.pass == 0 || sample.prompt != p.name) continue;
      if (!sample.ok) {
        ++result.failures;
        continue;
      }
      rates.push_back(sample.tok_per_s);
      prompt_toks.push_back(double(sample.prompt_tokens));
      completion_toks.push_back(double(sample.completion_tokens));
    }
    s.n = int64_t(rates.size());
    s.mean = mean_of(rates);
    s.median = median_of(rates);
    s.std = sample_std_of(rates);
    s.mean_prompt_tokens = mean_of(prompt_toks);
    s.mean_completion_tokens = mean_of(completion_toks);
    if (s.n > 0) means.push_back(s.mean);
    result.prompts.push_back(std::move(s));
  }
  result.cross_prompt_mean = mean_of(means);
}

namespace {

Spark5Sample run_one(BenchClient& client, const std::string& model, const Spark5Prompt& p, int pass,
                     const json& extra_body) {
  Spark5Sample s;
  s.pass = pass;
  s.prompt = p.name;
  // Exactly the reference's body: model, one user message, max_tokens, temperature 0.0.
  json body = {{"model", model},
               {"messages", json::array({{{"role", "user"}, {"content", p.text}}})},
               {"max_tokens", p.max_tokens},
               {"temperature", 0.0}};
  if (extra_body.is_object()) body.update(extra_body);
  const PlainResponse res = client.post_json("/v1/chat/completions", body);
  s.elapsed_s = res.elapsed_s;
  if (!res.ok) {
    s.error = res.error;
    return s;
  }
  const json& usage = res.body.contains("usage") ? res.body["usage"] : json();
  if (!usage.is_object() || !usage.contains("completion_tokens") || !usage["completion_tokens"].is_number_integer()) {
    s.error = "no usage.completion_tokens in the answer";
    return s;
  }
  s.completion_tokens = usage["completion_tokens"].get<int64_t>();
  if (usage.contains("prompt_tokens") && usage["prompt_tokens"].is_number_integer())
    s.prompt_tokens = usage["prompt_tokens"].get<int64_t>();
  if (s.completion_tokens <= 0) {
    s.error = "no completion tokens";  // the reference's FAILED case
    return s;
  }
  s.tok_per_s = s.elapsed_s > 0 ? double(s.completion_tokens) / s.elapsed_s : 0;
  s.ok = true;
  return s;
}

}  // namespace

Spark5Result run_spark5(const Spark5Options& o, std::FILE* log) {
  MOESERVE_CHECK(o.runs > 0, "--runs must be positive, got {}", o.runs);
  Spark5Result result;
  {
    BenchClient probe(o.client);
    result.model = o.model.empty() ? probe.first_model_id() : o.model;
  }
  auto scrape = [&](double& drafts, double& accepted) {
    BenchClient c(o.client);
    auto text = c.get_text("/metrics");
    return text && parse_spec_decode_counters(*text, drafts, accepted);
  };
  const int first_pass = o.warmup ? 0 : 1;
  double drafts0 = 0, accepted0 = 0;
  bool counters_before = false;
  for (int pass = first_pass; pass <= int(o.runs); ++pass) {
    if (pass == 1) counters_before = scrape(drafts0, accepted0);  // after the warm-up
    if (log) {
      const std::string title = pass == 0 ? "warm-up (discarded)" : fmt::format("run {}/{}", pass, o.runs);
      std::fprintf(log, "-- %s --\n", title.c_str());
    }
    for (const auto& p : spark5_prompts()) {
      BenchClient client(o.client);  // a fresh connection per request, as curl makes
      Spark5Sample s = run_one(client, result.model, p, pass, o.extra_body);
      if (log) {
        if (s.ok)
          std::fprintf(log, "  [%s] %lld tokens in %.2fs = %.1f tok/s (prompt: %lld)\n", p.name,
                       (long long)s.completion_tokens, s.elapsed_s, s.tok_per_s, (long long)s.prompt_tokens);
        else
          std::fprintf(log, "  [%s] FAILED: %s\n", p.name, s.error.c_str());
        std::fflush(log);
      }
      result.samples.push_back(std::move(s));
    }
  }
  double drafts1 = 0, accepted1 = 0;
  if (counters_before && scrape(drafts1, accepted1) && drafts1 > drafts0) {
    result.has_acceptance = true;
    result.mean_acceptance_length = 1.0 + (accepted1 - accepted0) / (drafts1 - drafts0);
  }
  summarize_spark5(result);
  return result;
}

std::string format_spark5_report(const Spark5Result& r) {
  std::string out = fmt::format("{:=^78}\n", " spark5 suite (albond bench_qwen35.sh method) ");
  out += fmt::format("model: {}\n", r.model);
  out += fmt::format("{:<10} {:>6} {:>4} {:>10} {:>10} {:>8} {:>9} {:>11}\n", "prompt", "max", "n", "mean tok/s",
                     "median", "std", "prompt tk", "complet. tk");
  for (const auto& p : r.prompts)
    out += fmt::format("{:<10} {:>6} {:>4} {:>10.2f} {:>10.2f} {:>8.2f} {:>9.1f} {:>11.1f}\n", p.name, p.max_tokens,
                       p.n, p.mean, p.median, p.std, p.mean_prompt_tokens, p.mean_completion_tokens);
  out += fmt::format("cross-prompt mean: {:.2f} tok/s (end to end: completion_tokens / request wall time)\n",
                     r.cross_prompt_mean);
  if (r.failures > 0) out += fmt::format("failed requests: {}\n", r.failures);
  if (r.has_acceptance) out += fmt::format("mean speculative acceptance length: {:.2f}\n", r.mean_acceptance_length);
  out += std::string(78, '=') + "\n";
  return out;
}

json spark5_result_json(const Spark5Result& r, const Spark5Options& o) {
  json j;
  j["date"] = now_local_string();
  j["suite"] = "spark5";
  j["base_url"] = o.client.base.scheme_host_port + o.client.base.path_prefix;
  j["model_id"] = r.model;
  j["runs"] = o.runs;
  j["warmup"] = o.warmup;
  j["cross_prompt_mean_tok_s"] = r.cross_prompt_mean;
  j["failed"] = r.failures;
  if (r.has_acceptance) j["mean_acceptance_length"] = r.mean_acceptance_length;
  json prompts = json::array();
  for (const auto& p : r.prompts)
    prompts.push_back({{"name", p.name},
                       {"max_tokens", p.max_tokens},
                       {"n", p.n},
                       {"mean_tok_s", p.mean},
                       {"median_tok_s", p.median},
                       {"std_tok_s", p.std},
                       {"mean_prompt_tokens", p.mean_prompt_tokens},
                       {"mean_completion_tokens", p.mean_completion_tokens}});
  j["prompts"] = std::move(prompts);
  json samples = json::array();
  for (const auto& s : r.samples)
    samples.push_back({{"pass", s.pass},
                       {"prompt", s.prompt},
                       {"ok", s.ok},
                       {"error", s.error},
                       {"prompt_tokens", s.prompt_tokens},
                       {"completion_tokens", s.completion_tokens},
                       {"elapsed_s", s.elapsed_s},
                       {"tok_s", s.tok_per_s}});
  j["samples"] = std::move(samples);
  return j;
}

}  // namespace moeserve::tools
