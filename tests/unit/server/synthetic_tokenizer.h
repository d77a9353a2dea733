// A small byte-level BPE tokenizer in the Qwen layout (same pre-tokenizer regex, ByteLevel
// decoder, ChatML added tokens), built in memory so that server tests load in milliseconds
// instead of parsing the 11 MB Qwen3 tokenizer.json in every test process. Its vocabulary is
// the 256 byte symbols, plus whole-word tokens (with and without a leading space) for the
// words the tests use, reached through left-to-right merges.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace moeserve::server::testing {

// GPT-2's byte -> printable symbol map (the ByteLevel alphabet).
inline std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> symbol(256);
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) s += char(cp);
    else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
    return s;
  };
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    symbol[size_t(b)] = utf8(printable ? b : next++);
  }
  return symbol;
}

inline text::Tokenizer make_synthetic_tokenizer() {
  using nlohmann::json;
  const auto alphabet = byte_level_alphabet();
  json vocab = json::object();
  int next_id = 0;
  for (const auto& s : alphabet) vocab[s] = next_id++;
  json merges = json::array();
  auto to_symbols = [&](const std::string& word) {
    std::vector<std::string> out;
    for (unsigned char c : word) out.push_back(alphabet[c]);
    return out;
  };
  const std::vector<std::string> words = {
      "say", "one", "two", "three", "four", "five", "six", "Hello", "there", "friend", "hello", "hi",
      "The", "capital", "is", "Paris", "Rome", "quick", "test", "alpha", "beta", "gamma", "streamed",
      "words", "here", "endless", "FOREVER", "STOP", "same", "yes", "you", "Hi", "works", "city",
      "parameter", "function", "get_weather", "tool_call", "think", "Streaming", "character", "by", "ok"};
  // Each word by left-to-right merges, then " word" as (space symbol, word): merges apply in
  // list order, so a word's own merges always come before the one that adds its space.
  auto add_merge = [&](const std::string& left, const std::string& right) {
    const std::string merged = left + right;
    if (vocab.contains(merged)) return;
    merges.push_back(json::array({left, right}));
    vocab[merged] = next_id++;
  };
  for (const auto& word : words) {
    auto symbols = to_symbols(word);
    std::string acc = symbols[0];
    for (size_t i = 1; i < symbols.size(); ++i) {
      add_merge(acc, symbols[i]);
      acc += symbols[i];
    }
  }
  for (const auto& word : words) {
    std::string joined;
    for (const auto& sym : to_symbols(word)) joined += sym;
    add_merge(alphabet[' '], joined);
  }
  json added = json::array();
  auto add = [&](const std::string& content, bool special) {
    added.push_back({{"id", next_id++}, {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", special}});
  };
  add("<|endoftext|>", true);
  add("<|im_start|>", true);
  add("<|im_end|>", true);
  for (const char* t : {"<think>", "</think>", "<tool_call>", "</tool_call>"}) add(t, false);

  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                           {"use_regex", false}};
  const json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      byte_level})}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merges}}}};
  const json config = {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
  return text::Tokenizer::from_json(tokenizer, config, "synthetic test tokenizer");
}

}  // namespace moeserve::server::testing
