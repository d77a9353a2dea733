#include "tools/bench_dataset.h"

#include <cmath>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace moeserve::tools {

using json = nlohmann::json;

namespace {

// Common English words that are one token, with their leading space, in byte-level BPE
// vocabularies (checked against the Qwen3 tokenizer.json: each " word" is a single entry).
constexpr const char* kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
    "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "they", "you",
    "were", "her", "she", "there", "one", "all", "we", "their", "has", "been", "would", "more", "when",
    "will", "who", "if", "no", "out", "so", "said", "what", "up", "its", "about", "into", "than",
    "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do",
    "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even", "most", "made",
    "after", "also", "did", "many", "before", "must", "through", "back", "years", "where", "much",
    "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how", "too",
    "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long",
    "here", "get", "both", "between", "life", "being", "under", "never", "day", "same", "another",
    "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against",
    "go", "came", "right", "used", "take", "three", "house", "water", "small", "found", "place",
    "number", "part", "light", "city", "river", "music", "story", "table", "system", "group", "school",
    "paper", "money", "night", "point", "power", "order", "field", "road", "market", "early", "during",
    "open", "study", "word", "green"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

int64_t draw_length(Rng& rng, int64_t len, double ratio) {
  if (ratio <= 0) return len;
  const auto lo = std::max<int64_t>(1, int64_t(std::floor(double(len) * (1 - ratio))));
  const auto hi = std::max<int64_t>(lo, int64_t(std::ceil(double(len) * (1 + ratio))));
  return lo + int64_t(rng.below(uint64_t(hi - lo + 1)));
}

}  // namespace

std::vector<GenerationRequest> make_random_prompts(const RandomPromptOptions& o) {
  MOESERVE_CHECK(o.num_prompts > 0, "--num-prompts must be positive, got {}", o.num_prompts);
  MOESERVE_CHECK(o.input_len > 0, "--input-len must be positive, got {}", o.input_len);
  MOESERVE_CHECK(o.output_len > 0, "--output-len must be positive, got {}", o.output_len);
  MOESERVE_CHECK(o.range_ratio >= 0 && o.range_ratio < 1, "--random-range-ratio must be in [0, 1), got {}",
                 o.range_ratio);
  Rng rng(o.seed);
  std::vector<GenerationRequest> out;
  out.reserve(size_t(o.num_prompts));
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    GenerationRequest r;
    const int64_t in_len = draw_length(rng, o.input_len, o.range_ratio);
    r.max_tokens = draw_length(rng, o.output_len, o.range_ratio);
    r.planned_prompt_tokens = in_len;
    if (o.token_ids) {
      r.prompt_token_ids.reserve(size_t(in_len));
      for (int64_t t = 0; t < in_len; ++t)
        r.prompt_token_ids.push_back(
            kRandomTokenIdLow + int32_t(rng.below(uint64_t(kRandomTokenIdHigh - kRandomTokenIdLow))));
    } else {
      for (int64_t t = 0; t < in_len; ++t) {
        if (t > 0) r.prompt.push_back(' ');
        r.prompt += kWords[rng.below(kNumWords)];
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<GenerationRequest> load_jsonl_prompts(const std::filesystem::path& path, int64_t num_prompts,
                                                  int64_t default_output_len, ApiEndpoint endpoint) {
  MOESERVE_CHECK(num_prompts > 0, "--num-prompts must be positive, got {}", num_prompts);
  std::ifstream in(path);
  MOESERVE_CHECK(in.good(), "cannot open the dataset '{}'", path.string());
  std::vector<GenerationRequest> entries;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = json::parse(line, nullptr, false);
    const std::string where = fmt::format("{}:{}", path.string(), line_no);
    MOESERVE_CHECK(!j.is_discarded() && j.is_object(), "{}: not a JSON object", where);
    GenerationRequest r;
    r.max_tokens = default_output_len;
    if (auto p = j.find("prompt"); p != j.end()) {
      MOESERVE_CHECK(p->is_string(), "{}: \"prompt\" must be a string", where);
      r.prompt = p->get<std::string>();
    } else if (auto m = j.find("messages"); m != j.end()) {
      MOESERVE_CHECK(endpoint == ApiEndpoint::Chat, "{}: \"messages\" needs --endpoint chat", where);
      MOESERVE_CHECK(m->is_array() && !m->empty(), "{}: \"messages\" must be a non-empty array", where);
      for (const auto& msg : *m)
        MOESERVE_CHECK(msg.is_object() && msg.contains("role") && msg["role"].is_string(),
                       "{}: every message needs a string \"role\"", where);
      r.messages = *m;
    } else {
      fail("{}: expected a \"prompt\" or a \"messages\" field", where);
    }
    for (const char* key : {"max_tokens", "output_len"}) {
      if (auto t = j.find(key); t != j.end()) {
        MOESERVE_CHECK(t->is_number_integer() && t->get<int64_t>() > 0, "{}: \"{}\" must be a positive integer",
                       where, key);
        r.max_tokens = t->get<int64_t>();
      }
    }
    MOESERVE_CHECK(r.max_tokens > 0, "{}: no \"max_tokens\" and no --output-len", where);
    entries.push_back(std::move(r));
  }
  MOESERVE_CHECK(!entries.empty(), "the dataset '{}' holds no prompt", path.string());
  std::vector<GenerationRequest> out;
  out.reserve(size_t(num_prompts));
  for (int64_t i = 0; i < num_prompts; ++i) out.push_back(entries[size_t(i) % entries.size()]);
  return out;
}

std::vector<double> make_arrival_times(int64_t n, double request_rate, double burstiness, uint64_t seed) {
  MOESERVE_CHECK(request_rate > 0, "--request-rate must be positive (or inf), got {}", request_rate);
  MOESERVE_CHECK(burstiness > 0, "--burstiness must be positive, got {}", burstiness);
  std::vector<double> times(size_t(std::max<int64_t>(n, 0)), 0.0);
  if (std::isinf(request_rate) || times.empty()) return times;
  // Separate stream from the prompts' (which use `seed` itself).
  Rng rng(seed ^ 0x5bd1e9955bd1e995ull);
  const double scale = 1.0 / (request_rate * burstiness);
  double t = 0;
  for (auto& v : times) v = (t += rng.gamma(burstiness) * scale);
  // Rescale so the whole schedule spans exactly n / rate seconds, as vLLM does: the raw sum
  // of n random gaps misses its expectation by a few percent, which would move throughput.
  const double factor = (double(n) / request_rate) / times.back();
  for (auto& v : times) v *= factor;
  return times;
}

}  // namespace moeserve::tools
