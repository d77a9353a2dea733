// The Tokenizer API on the real Qwen3 tokenizer: vocabulary lookups, special tokens from
// tokenizer_config.json, add_special_tokens, decode options, invalid input, loading from a
// directory or a file, load errors, the word cache, and concurrent encoding.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/tokenizer_added_tokens.h"
#include "tokenizer_fixtures.h"

namespace moeserve::text {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace moeserve::text::testing;
using Ids = std::vector<int32_t>;

const Tokenizer& qwen3() { return variant_tokenizer("qwen3"); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(TokenizerApi, VocabularyLookups) {
  MOESERVE_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3();
  // 151643 BPE entries + 26 added tokens (ids 151643..151668).
  EXPECT_EQ(tok.vocab_size(), 151669);
  EXPECT_EQ(tok.added_tokens().size(), 26u);
  EXPECT_EQ(tok.token_to_id("Hello"), 9707);
  EXPECT_EQ(tok.token_to_id("\xC4\xA0world"), 1879);  // "Ġworld"
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(tok.id_to_token(9707), "Hello");
  EXPECT_EQ(tok.id_to_token(198), "\xC4\x8A");  // "Ċ", the newline
  EXPECT_EQ(tok.id_to_token(151667), "<think>");
  EXPECT_NE(error_of([&] { tok.id_to_token(151669); }).find("151669"), std::string::npos);
  EXPECT_THROW(tok.id_to_token(-1), Error);
}

TEST(TokenizerApi, SpecialTokensFromTheTwoFiles) {
  MOESERVE_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3();
  EXPECT_TRUE(tok.is_special(151643));   // <|endoftext|>
  EXPECT_TRUE(tok.is_special(151644));   // <|im_start|>
  EXPECT_FALSE(tok.is_special(151667));  // <think> is special=false in tokenizer.json
  EXPECT_FALSE(tok.is_special(151657));  // <tool_call>
  EXPECT_FALSE(tok.is_special(9707));
  EXPECT_FALSE(tok.is_special(-4));
  EXPECT_EQ(tok.eos_token(), "<|im_end|>");
  EXPECT_EQ(tok.eos_token_id(), 151645);
  EXPECT_EQ(tok.pad_token(), "<|endoftext|>");
  EXPECT_EQ(tok.pad_token_id(), 151643);
  EXPECT_EQ(tok.bos_token(), std::nullopt);  // Qwen has no BOS
  EXPECT_EQ(tok.bos_token_id(), std::nullopt);
  ASSERT_TRUE(tok.config().contains("chat_template"));
  EXPECT_NE(tok.config()["chat_template"].get<std::string>().find("<|im_start|>"),
            std::string::npos);
}

TEST(TokenizerApi, KnownIdsAndNoBos) {
  MOESERVE_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3();
  // The example of /work/shared/spec/deps.md (checked there with the npm port).
  const std::string text = "<|im_start|>user\n\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, "
                           "\xE4\xBD\xA0\xE5\xA5\xBD! 12345 it's  \n\n  x<|im_end|>";
  const Ids expected = {151644, 872, 198, 53645, 26991, 8178, 11, 220, 108386, 0, 220,
                        16,     17,  18,  19,    20,    432,  594, 18611, 220, 856, 151645};
  EXPECT_EQ(tok.encode(text), expected);
  EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/true), expected);
  EXPECT_EQ(tok.encode("Hello world", true), (Ids{9707, 1879}));
  EXPECT_EQ(tok.encode(""), Ids{});
}

TEST(TokenizerApi, DecodeOptions) {
  MOESERVE_REQUIRE_QWEN3();
  const Tokenizer& tok = qwen3();
  Ids ids = {151644, 872, 198};  // <|im_start|> user \n
  for (int32_t id : tok.encode("hi")) ids.push_back(id);
  ids.insert(ids.end(), {151645, 151667, 87, 151668});  // <|im_end|> <think> x </think>
  EXPECT_EQ(tok.decode(ids), "<|im_start|>user\nhi<|im_end|><think>x</think>");
  // Only tokens flagged special are skipped: <think> stays.
  EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true), "user\nhi<think>x</think>");
  // Ids that name no token are skipped, like HF does (the model's padded rows, for example).
  EXPECT_EQ(tok.decode(Ids{9707, 200000, -1, 1879}), "Hello world");
  EXPECT_EQ(tok.decode(Ids{}), "");
}

TEST(TokenizerApi, InvalidUtf8NamesTheByteOffset) {
  MOESERVE_REQUIRE_QWEN3();
  const std::string message = error_of([] { qwen3().encode("abc \xE4\xBD x"); });
  EXPECT_NE(message.find("invalid UTF-8"), std::string::npos) << message;
  EXPECT_NE(message.find("byte offset 4"), std::string::npos) << message;
  EXPECT_THROW(qwen3().encode(std::string("\xC0\x80", 2)), Error);
}

TEST(TokenizerApi, LoadsFromDirectoryOrFile) {
  MOESERVE_REQUIRE_QWEN3();
  const Tokenizer from_dir = Tokenizer::load(qwen3_dir());
  const Tokenizer from_file = Tokenizer::load(qwen3_dir() / "tokenizer.json");
  const std::string text = "Loading twice gives the same ids, 你好 🙂";
  EXPECT_EQ(from_dir.encode(text), qwen3().encode(text));
  EXPECT_EQ(from_file.encode(text), qwen3().encode(text));
  EXPECT_EQ(from_file.eos_token_id(), 151645);  // tokenizer_config.json found next to the file
  EXPECT_NE(from_dir.source().find("tokenizer.json"), std::string::npos);
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("moeserve_tok_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  void write(const std::string& name, const std::string& content) const {
    std::ofstream(path_ / name, std::ios::binary) << content;
  }

 private:
  fs::path path_;
};

TEST(TokenizerApi, LoadErrorsNameTheFile) {
  TempDir dir;
  std::string message = error_of([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(message.find((dir.path() / "tokenizer.json").string()), std::string::npos) << message;
  dir.write("tokenizer.json", "{\"model\": ");
  message = error_of([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(message.find("is not valid JSON"), std::string::npos) << message;
  dir.write("tokenizer.json",
            R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}, "added_tokens": []})");
  message = error_of([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(message.find("model type 'Unigram' is not supported"), std::string::npos) << message;
  dir.write("tokenizer.json",
            R"({"normalizer": {"type": "Lowercase"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  message = error_of([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(message.find("normalizer type 'Lowercase' is not supported"), std::string::npos)
      << message;
  dir.write("tokenizer.json",
            R"({"decoder": {"type": "Metaspace"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  message = error_of([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(message.find("decoder type 'Metaspace' is not supported"), std::string::npos)
      << message;
  dir.write("tokenizer.json",
            R"({"post_processor": {"type": "Magic"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  message = error_of([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(message.find("post-processor type 'Magic'"), std::string::npos) << message;
  dir.write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  dir.write("tokenizer_config.json", R"({"eos_token": 5})");
  message = error_of([&] { Tokenizer::load(dir.path()); });
  EXPECT_NE(message.find("eos_token"), std::string::npos) << message;
  // An AddedToken object is accepted for the special token names.
  dir.write("tokenizer_config.json", R"({"eos_token": {"content": "a", "lstrip": false}})");
  EXPECT_EQ(Tokenizer::load(dir.path()).eos_token_id(), 0);
}

TEST(TokenizerApi, TemplateProcessingAddsSpecialTokens) {
  MOESERVE_REQUIRE_QWEN3();
  const Tokenizer& tok = variant_tokenizer("template");
  EXPECT_EQ(tok.encode("Hello world", true), (Ids{151643, 9707, 1879, 151645}));
  EXPECT_EQ(tok.encode("Hello world", false), (Ids{9707, 1879}));
}

TEST(TokenizerApi, CacheDoesNotChangeResults) {
  MOESERVE_REQUIRE_QWEN3();
  const Tokenizer uncached = Tokenizer::from_json(qwen3_tokenizer_json(), qwen3_config_json(),
                                                  "qwen3 uncached", TokenizerOptions{0});
  const Tokenizer tiny = Tokenizer::from_json(qwen3_tokenizer_json(), qwen3_config_json(),
                                              "qwen3 tiny cache", TokenizerOptions{64});
  for (const auto& c : corpus().at("cases")) {
    if (c.value("variant", "qwen3") != "qwen3" || c.value("repeat", 1) > 1) continue;
    const std::string text = case_text(c);
    const Ids ids = qwen3().encode(text);
    EXPECT_EQ(uncached.encode(text), ids) << c["name"];
    EXPECT_EQ(tiny.encode(text), ids) << c["name"];
    EXPECT_EQ(tiny.encode(text), ids) << c["name"];  // now from the cache
  }
}

TEST(TokenizerApi, ConcurrentEncodeGivesTheSameIds) {
  MOESERVE_REQUIRE_QWEN3();
  // A fresh tokenizer (cold cache), so threads race on filling it.
  const Tokenizer tok = Tokenizer::from_json(qwen3_tokenizer_json(), qwen3_config_json(),
                                             "qwen3 concurrent", TokenizerOptions{256});
  std::vector<std::string> texts;
  std::vector<Ids> expected;
  for (const auto& c : corpus().at("cases")) {
    if (c.value("variant", "qwen3") != "qwen3" || c.value("repeat", 1) > 1) continue;
    texts.push_back(case_text(c));
    expected.push_back(qwen3().encode(texts.back()));
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i + static_cast<size_t>(t) * 7 + static_cast<size_t>(round)) % texts.size();
          if (tok.encode(texts[k]) != expected[k]) ++mismatches;
        }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace moeserve::text
