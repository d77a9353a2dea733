// Where the load benchmark's prompts and send times come from: random prompts of a planned
// token length, a JSONL dataset, and the arrival schedule (`--request-rate`, `--burstiness`).
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "tools/bench_client.h"
#include "tools/bench_rng.h"

namespace moeserve::tools {

struct RandomPromptOptions {
  int64_t num_prompts = 0;
  int64_t input_len = 0;        // planned prompt tokens
  int64_t output_len = 0;       // max_tokens
  double range_ratio = 0.0;     // lengths drawn uniformly from [len*(1-r), len*(1+r)]
  uint64_t seed = 0;
  bool token_ids = false;       // completions: send random token ids instead of words
};

// Random prompts. As words: each prompt is a run of common English words drawn with
// replacement from a fixed list of words that byte-level BPE vocabularies (GPT-2, Qwen,
// Llama 3) hold as one token with their leading space, so a prompt of n words is about n
// tokens; the server's usage.prompt_tokens gives the exact count. As token ids: ids drawn
// uniformly from [kRandomTokenIdLow, kRandomTokenIdHigh), ordinary BPE merges in those
// vocabularies (far below their special tokens), so the length is exact.
// Deterministic for a given seed (the generator is ours, not the standard library's
// implementation-defined distributions).
std::vector<GenerationRequest> make_random_prompts(const RandomPromptOptions& o);
inline constexpr int32_t kRandomTokenIdLow = 1000;
inline constexpr int32_t kRandomTokenIdHigh = 30000;

// A JSONL dataset: one JSON object per line, blank lines skipped, with
//   "prompt": "text"                   (either endpoint), or
//   "messages": [{"role":..,"content":..}, ...]   (chat endpoint only),
// and optionally "max_tokens" (or "output_len") overriding `default_output_len`.
// Takes the first `num_prompts` entries, cycling when the file has fewer. Errors name the
// file and the line.
std::vector<GenerationRequest> load_jsonl_prompts(const std::filesystem::path& path, int64_t num_prompts,
                                                  int64_t default_output_len, ApiEndpoint endpoint);

// Send times in seconds from the start, one per request, non-decreasing. An infinite rate
// sends everything at once (all zeros). Otherwise the gaps are Gamma(shape=burstiness,
// scale=1/(rate*burstiness)) -- exponential, i.e. a Poisson process, at burstiness 1 -- and,
// as vLLM does, the cumulative times are rescaled so that the last one is exactly n / rate.
std::vector<double> make_arrival_times(int64_t n, double request_rate, double burstiness, uint64_t seed);

}  // namespace moeserve::tools
