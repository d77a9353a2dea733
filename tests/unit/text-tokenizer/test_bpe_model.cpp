// The BPE model on small hand-made vocabularies: merge order, the merges formats, unk /
// fuse_unk / byte_fallback / ignore_merges / subword prefix and suffix (HF BPE semantics), a
// randomized comparison with a naive string-based BPE (covering both the short-word scan and
// the heap used for long words), and load-time errors.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer.h"

namespace moeserve::text {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

json bpe_tokenizer(const json& vocab, const json& merges, const json& model_extra = json::object(),
                   const json& pre_tokenizer = json()) {
  json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  for (auto& [key, value] : model_extra.items()) model[key] = value;
  return json{{"version", "1.0"},        {"normalizer", nullptr},
              {"pre_tokenizer", pre_tokenizer}, {"model", model},
              {"added_tokens", json::array()},  {"decoder", nullptr},
              {"post_processor", nullptr}};
}

Tokenizer make(const json& tokenizer_json, size_t cache = 1 << 10) {
  return Tokenizer::from_json(tokenizer_json, json(), "test tokenizer.json",
                              TokenizerOptions{cache});
}

TEST(BpeModel, LowestRankMergesFirst) {
  const json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}};
  // b+c outranks a+b: a | bc, then a+bc.
  EXPECT_EQ(make(bpe_tokenizer(vocab, {"b c", "a b", "a bc"})).encode("abc"), (Ids{5}));
  EXPECT_EQ(make(bpe_tokenizer(vocab, {"b c", "a b"})).encode("abc"), (Ids{0, 4}));
  EXPECT_EQ(make(bpe_tokenizer(vocab, {"a b", "b c"})).encode("abc"), (Ids{3, 2}));
  // The same merges as ["a", "b"] pairs.
  EXPECT_EQ(make(bpe_tokenizer(vocab, json::array({json::array({"a", "b"}), json::array({"b", "c"})})))
                .encode("abc"),
            (Ids{3, 2}));
}

TEST(BpeModel, EqualRanksMergeLeftmostFirst) {
  const json vocab = {{"a", 0}, {"aa", 1}, {"aaaa", 2}};
  const Tokenizer tok = make(bpe_tokenizer(vocab, {"a a", "aa aa"}));
  EXPECT_EQ(tok.encode("aaa"), (Ids{1, 0}));
  EXPECT_EQ(tok.encode("aaaaa"), (Ids{2, 0}));
  EXPECT_EQ(tok.encode("aaaaaaa"), (Ids{2, 1, 0}));
}

TEST(BpeModel, UnknownCharacters) {
  const json vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}};
  // Without an unk token, an unknown character is dropped (HF does the same), and its
  // neighbours become adjacent symbols that can merge.
  EXPECT_EQ(make(bpe_tokenizer(vocab, {"a b"})).encode("axyb"), (Ids{3}));
  EXPECT_EQ(make(bpe_tokenizer(vocab, {"a b"}, {{"unk_token", "<unk>"}})).encode("abxyb"),
            (Ids{3, 0, 0, 2}));
  EXPECT_EQ(make(bpe_tokenizer(vocab, {"a b"}, {{"unk_token", "<unk>"}, {"fuse_unk", true}}))
                .encode("abxyb"),
            (Ids{3, 0, 2}));
}

TEST(BpeModel, ByteFallbackUsesByteTokens) {
  // U+00E9 is C3 A9 in UTF-8.
  const json vocab = {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}};
  const Tokenizer tok =
      make(bpe_tokenizer(vocab, json::array(), {{"unk_token", "<unk>"}, {"byte_fallback", true}}));
  EXPECT_EQ(tok.encode("a\xC3\xA9"), (Ids{1, 2, 3}));
  EXPECT_EQ(tok.encode("a\xE2\x82\xAC"), (Ids{1, 0}));  // no <0xE2>: the unk token
}

TEST(BpeModel, IgnoreMergesTakesWholeVocabularyWords) {
  const json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}};
  EXPECT_EQ(make(bpe_tokenizer(vocab, {"a b"})).encode("abc"), (Ids{3, 2}));
  EXPECT_EQ(make(bpe_tokenizer(vocab, {"a b"}, {{"ignore_merges", true}})).encode("abc"), (Ids{4}));
}

TEST(BpeModel, ContinuingSubwordPrefixAndEndOfWordSuffix) {
  const json vocab = {{"a", 0}, {"##b", 1}, {"##c</w>", 2}, {"ab", 3}, {"abc</w>", 4}, {"a</w>", 5}};
  const Tokenizer tok = make(bpe_tokenizer(
      vocab, {"a ##b", "ab ##c</w>"},
      {{"continuing_subword_prefix", "##"}, {"end_of_word_suffix", "</w>"}}));
  EXPECT_EQ(tok.encode("abc"), (Ids{4}));
  EXPECT_EQ(tok.encode("a"), (Ids{5}));
}

// A direct transcription of the BPE definition on strings: repeatedly merge the adjacent pair
// with the lowest rank, leftmost first.
std::vector<std::string> naive_bpe(const std::string& word,
                                   const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> symbols;
  for (char c : word) symbols.emplace_back(1, c);
  while (symbols.size() > 1) {
    int best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = ranks.find({symbols[i], symbols[i + 1]});
      if (it != ranks.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + static_cast<long>(best) + 1);
  }
  return symbols;
}

TEST(BpeModel, MatchesNaiveBpeOnRandomVocabulariesAndLongWords) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    json vocab = json::object();
    std::vector<std::string> tokens = {"a", "b", "c", "d"};
    for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = static_cast<int>(i);
    json merges = json::array();
    std::map<std::pair<std::string, std::string>, int> ranks;
    while (merges.size() < 80) {
      const std::string& left = tokens[std::uniform_int_distribution<size_t>(0, tokens.size() - 1)(rng)];
      const std::string& right = tokens[std::uniform_int_distribution<size_t>(0, tokens.size() - 1)(rng)];
      if (left.size() + right.size() > 12 || ranks.count({left, right})) continue;
      const std::string merged = left + right;
      ranks[{left, right}] = static_cast<int>(merges.size());
      merges.push_back(json::array({left, right}));
      if (!vocab.contains(merged)) {
        vocab[merged] = static_cast<int>(tokens.size());
        tokens.push_back(merged);
      }
    }
    const Tokenizer tok = make(bpe_tokenizer(vocab, merges), /*cache=*/0);
    for (int w = 0; w < 30; ++w) {
      const size_t length = std::uniform_int_distribution<size_t>(1, 300)(rng);
      std::string word;
      for (size_t i = 0; i < length; ++i)
        word.push_back(static_cast<char>('a' + std::uniform_int_distribution<int>(0, 3)(rng)));
      Ids expected;
      for (const std::string& s : naive_bpe(word, ranks)) expected.push_back(vocab[s].get<int32_t>());
      ASSERT_EQ(tok.encode(word), expected) << "trial " << trial << " word " << word;
    }
  }
}

std::string load_error(const json& tokenizer_json) {
  try {
    make(tokenizer_json);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(BpeModel, LoadErrorsNameTheField) {
  const json vocab = {{"a", 0}, {"b", 1}, {"ab", 2}};
  std::string message = load_error(bpe_tokenizer(vocab, {"a c"}));
  EXPECT_NE(message.find("model.merges[0]"), std::string::npos) << message;
  EXPECT_NE(message.find("'c'"), std::string::npos) << message;
  message = load_error(bpe_tokenizer(vocab, {"a b b"}));
  EXPECT_NE(message.find("model.merges[0]"), std::string::npos) << message;
  message = load_error(bpe_tokenizer(json{{"a", 0}, {"b", 1}}, {"a b"}));
  EXPECT_NE(message.find("merged token 'ab'"), std::string::npos) << message;
  message = load_error(bpe_tokenizer(json{{"a", -3}}, json::array()));
  EXPECT_NE(message.find("model.vocab"), std::string::npos) << message;
  message = load_error(bpe_tokenizer(vocab, {"a b"}, {{"dropout", 0.1}}));
  EXPECT_NE(message.find("dropout"), std::string::npos) << message;
  message = load_error(bpe_tokenizer(vocab, {"a b"}, {{"unk_token", "<unk>"}}));
  EXPECT_NE(message.find("unk_token '<unk>'"), std::string::npos) << message;
  json word_piece = bpe_tokenizer(vocab, {"a b"});
  word_piece["model"]["type"] = "WordPiece";
  message = load_error(word_piece);
  EXPECT_NE(message.find("model type 'WordPiece' is not supported"), std::string::npos) << message;
}

}  // namespace
}  // namespace moeserve::text
