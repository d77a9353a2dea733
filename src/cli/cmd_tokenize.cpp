// moeserve tokenize --tokenizer DIR (--text "..." | --file F): prints {"ids": [...]}, the token
// ids of the text (src/text/tokenizer.h). No special tokens are added unless
// --add-special-tokens is given (then the tokenizer's post-processor decides; Qwen adds none).
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "core/file_text.h"
#include "text/tokenizer.h"

namespace {

struct TokenizeOptions {
  std::string tokenizer_dir;
  std::string text;
  std::string file;
  bool add_special_tokens = false;
  std::string device = "cpu";
  int threads = 0;
};

int run_tokenize(const TokenizeOptions& o) {
  const moeserve::text::Tokenizer tokenizer = moeserve::text::Tokenizer::load(o.tokenizer_dir);
  const std::string text = o.file.empty() ? o.text : moeserve::read_file_text(o.file, "text file");
  const std::vector<int32_t> ids = tokenizer.encode(text, o.add_special_tokens);
  std::cout << nlohmann::json{{"ids", ids}}.dump() << "\n";
  return 0;
}

moeserve::cli::Registrar reg{
    "tokenize", "Print the token ids of a text as JSON: {\"ids\": [...]}", [](CLI::App& app) {
      auto o = std::make_shared<TokenizeOptions>();
      app.add_option("--tokenizer", o->tokenizer_dir,
                     "Model directory with tokenizer.json (and tokenizer_config.json), or the "
                     "tokenizer.json file")
          ->required();
      auto* text = app.add_option("--text", o->text, "The text to tokenize");
      auto* file = app.add_option("--file", o->file, "Read the text to tokenize from this file")
                       ->check(CLI::ExistingFile);
      text->excludes(file);
      file->excludes(text);
      app.add_flag("--add-special-tokens", o->add_special_tokens,
                   "Add the post-processor's special tokens (BOS/EOS); Qwen adds none");
      app.add_option("--device", o->device, "Accepted like every subcommand; tokenizing runs on the CPU")
          ->check(CLI::IsMember({"cpu", "cuda"}))
          ->capture_default_str();
      app.add_option("--threads", o->threads, "Accepted like every subcommand; unused")
          ->capture_default_str();
      app.callback([text, file] {
        if (text->count() == 0 && file->count() == 0)
          throw CLI::RequiredError("--text or --file");
      });
      return [o] { return run_tokenize(*o); };
    }};

}  // namespace
