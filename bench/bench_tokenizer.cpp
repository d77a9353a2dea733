// Tokenizer throughput on the real Qwen3 tokenizer (third_party/tokenizers/qwen3, fetched by
// scripts/install-deps.sh). Reports MB/s of input text (bytes_per_second) for encode with a
// warm word cache, encode without the cache, mixed scripts, decode and the streaming
// detokenizer, plus the load time. Target (issue "Text"): >= 5 MB/s of English on one core.
//
// The English-like corpus is generated here from a fixed word list and sentence shapes (seeded,
// so every run measures the same text); nothing copyrighted is bundled.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace {

using moeserve::text::StreamingDetokenizer;
using moeserve::text::Tokenizer;
using moeserve::text::TokenizerOptions;

const std::filesystem::path kQwen3Dir =
    std::filesystem::path(MOESERVE_SOURCE_DIR) / "third_party/tokenizers/qwen3";

const char* const kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "year",
    "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state", "family",
    "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company",
    "system", "program", "question", "work", "government", "number", "night", "point", "home",
    "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study",
    "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service",
    "friend", "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city",
    "community", "name", "president", "team", "minute", "idea", "kid", "body", "information",
    "back", "parent", "face", "others", "level", "office", "door", "health", "person", "art",
    "war", "history", "party", "result", "change", "morning", "reason", "research", "girl", "guy",
    "moment", "air", "teacher", "force", "education", "foot", "boy", "age", "policy", "process",
    "music", "market", "sense", "nation", "plan", "college", "interest", "death", "experience",
    "effect", "use", "class", "control", "care", "field", "development", "role", "effort", "rate",
    "heart", "drug", "show", "leader", "light", "voice", "wife", "police", "mind", "price",
    "report", "decision", "son", "view", "relationship", "town", "road", "arm", "difference",
    "value", "building", "action", "model", "season", "society", "tax", "director", "position",
    "player", "record", "paper", "space", "ground", "form", "event", "official", "matter",
    "center", "couple", "site", "project", "activity", "star", "table", "need", "court",
    "American", "oil", "situation", "cost", "industry", "figure", "street", "image", "phone",
    "data", "picture", "practice", "piece", "land", "product", "doctor", "wall", "patient",
    "worker", "news", "test", "movie", "north", "love", "support", "technology", "step", "baby",
    "computer", "type", "attention", "film", "tree", "source", "organization", "hair", "window",
    "evidence", "population", "site", "training", "bank", "lake", "river", "mountain", "ledger",
    "said", "made", "found", "took", "gave", "walked", "thought", "believed", "wrote", "counted",
    "quickly", "slowly", "carefully", "usually", "rarely", "never", "always", "often", "really",
    "new", "good", "high", "old", "great", "big", "small", "large", "national", "young",
    "different", "black", "long", "little", "important", "political", "bad", "white", "real",
    "best", "public", "sure", "low", "early", "able", "human", "local", "late", "hard", "major",
    "better", "economic", "strong", "possible", "whole", "free", "military", "true", "federal",
    "international", "full", "special", "easy", "clear", "recent", "certain", "personal", "open",
    "red", "difficult", "available", "likely", "short", "single", "medical", "current", "wrong",
    "don't", "it's", "we're", "they've", "she'll", "I'm", "wouldn't", "can't",
};

// Seeded English-like text: sentences of 5-25 words, capitalized, with commas, quotes,
// parentheses, numbers and paragraph breaks.
std::string english_corpus(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::string text;
  text.reserve(bytes + 256);
  while (text.size() < bytes) {
    const int length = pick(5, 25);
    for (int i = 0; i < length; ++i) {
      std::string word = kWords[pick(0, static_cast<int>(std::size(kWords)) - 1)];
      if (i == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
      const int decoration = pick(0, 99);
      if (decoration < 3) word = std::to_string(pick(0, 99999));
      else if (decoration < 5) word = "\"" + word + "\"";
      else if (decoration < 6) word = "(" + word + ")";
      text += word;
      if (i + 1 < length) text += pick(0, 9) == 0 ? ", " : " ";
    }
    const int end = pick(0, 19);
    text += end == 0 ? "?" : end == 1 ? "!" : ".";
    text += pick(0, 7) == 0 ? "\n\n" : " ";
  }
  return text;
}

std::string mixed_scripts_corpus(size_t bytes) {
  const std::string unit =
      "Mixed text: \xE6\xBC\xA2\xE5\xAD\x97\xE3\x81\xA8\xE3\x81\x8B\xE3\x81\xAA, "
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xD0\xBC\xD0\xB8\xD1\x80, "
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7, \xEC\x95\x88\xEB\x85\x95\xED\x95\x98\xEC\x84"
      "\xB8\xEC\x9A\x94 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x87\xAF\xF0\x9F\x87\xB5 "
      "caf\xC3\xA9 na\xC3\xAFve 2024-06-01\n";
  std::string text;
  while (text.size() < bytes) text += unit;
  return text;
}

const Tokenizer* tokenizer(size_t cache_capacity) {
  static const Tokenizer* cached = nullptr;
  static const Tokenizer* uncached = nullptr;
  const Tokenizer*& slot = cache_capacity ? cached : uncached;
  if (!slot && std::filesystem::exists(kQwen3Dir / "tokenizer.json"))
    slot = new Tokenizer(Tokenizer::load(kQwen3Dir, TokenizerOptions{cache_capacity}));
  return slot;
}

#define REQUIRE_TOKENIZER(tok)                                                             \
  if (!(tok)) {                                                                            \
    state.SkipWithError("third_party/tokenizers/qwen3 is missing: run scripts/install-deps.sh"); \
    return;                                                                                \
  }

void encode_bench(benchmark::State& state, const Tokenizer* tok, const std::string& text) {
  REQUIRE_TOKENIZER(tok);
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["bytes_per_token"] = benchmark::Counter(
      static_cast<double>(text.size()) / static_cast<double>(tokens), benchmark::Counter::kAvgThreads);
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(tokens) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_EncodeEnglishWarmCache(benchmark::State& state) {
  static const std::string text = english_corpus(1 << 20, 1);
  const Tokenizer* tok = tokenizer(1 << 16);
  if (tok) tok->encode(text);  // fill the cache
  encode_bench(state, tok, text);
}
BENCHMARK(BM_EncodeEnglishWarmCache)->Unit(benchmark::kMillisecond);

// Fresh text on every iteration would measure cache misses; the cleanest worst case is no
// cache at all.
void BM_EncodeEnglishNoCache(benchmark::State& state) {
  static const std::string text = english_corpus(1 << 20, 2);
  encode_bench(state, tokenizer(0), text);
}
BENCHMARK(BM_EncodeEnglishNoCache)->Unit(benchmark::kMillisecond);

void BM_EncodeMixedScripts(benchmark::State& state) {
  static const std::string text = mixed_scripts_corpus(1 << 20);
  encode_bench(state, tokenizer(1 << 16), text);
}
BENCHMARK(BM_EncodeMixedScripts)->Unit(benchmark::kMillisecond);

// Several threads on one shared tokenizer (the server's case): bytes/s is the total over the
// threads, per second of wall time.
void BM_EncodeEnglishThreads(benchmark::State& state) {
  static const std::string text = english_corpus(1 << 18, 3);
  encode_bench(state, tokenizer(1 << 16), text);
}
BENCHMARK(BM_EncodeEnglishThreads)->Threads(1)->Threads(2)->Threads(4)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Decode(benchmark::State& state) {
  const Tokenizer* tok = tokenizer(1 << 16);
  REQUIRE_TOKENIZER(tok);
  static const std::string text = english_corpus(1 << 20, 4) + mixed_scripts_corpus(1 << 18);
  static const std::vector<int32_t> ids = tok->encode(text);
  for (auto _ : state) benchmark::DoNotOptimize(tok->decode(ids));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_StreamingDetokenizer(benchmark::State& state) {
  const Tokenizer* tok = tokenizer(1 << 16);
  REQUIRE_TOKENIZER(tok);
  static const std::string text = english_corpus(1 << 19, 5) + mixed_scripts_corpus(1 << 17);
  static const std::vector<int32_t> ids = tok->encode(text);
  for (auto _ : state) {
    StreamingDetokenizer detok(*tok, false);
    size_t produced = 0;
    for (int32_t id : ids) produced += detok.push(id).size();
    produced += detok.flush().size();
    benchmark::DoNotOptimize(produced);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(ids.size()) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_StreamingDetokenizer)->Unit(benchmark::kMillisecond);

void BM_Load(benchmark::State& state) {
  if (!std::filesystem::exists(kQwen3Dir / "tokenizer.json")) {
    state.SkipWithError("third_party/tokenizers/qwen3 is missing: run scripts/install-deps.sh");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(Tokenizer::load(kQwen3Dir).vocab_size());
}
BENCHMARK(BM_Load)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
