// A model's chat template: turns OpenAI-style messages (+ tools) into the prompt text,
// byte-identical to transformers' apply_chat_template(..., tokenize=False) with
// Jinja2 (see src/text/jinja/). The server and `moeserve render-chat` use it.
//
// Where the template comes from (transformers' rules):
//   - <model_dir>/chat_template.jinja, if present;
//   - else "chat_template" in <model_dir>/tokenizer_config.json: a string, or a list of
//     {"name", "template"} where "tool_use" is used when tools are given and it exists,
//     otherwise "default";
//   - or an explicit file / inline template (--chat-template), which wins over both.
// The special tokens of tokenizer_config.json (bos_token, eos_token, ...) are template
// variables, as are chat_template_kwargs (e.g. enable_thinking=false).
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/jinja/template.h"

namespace moeserve::text {

class ChatTemplate {
 public:
  // From the model (or tokenizer) directory. Throws moeserve::Error when it has no chat
  // template or the template does not parse.
  static ChatTemplate load(const std::filesystem::path& model_dir);
  // `file_or_inline` (the --chat-template flag): an existing file is read, anything
  // else that looks like a template ("{", "}" or a newline) is the template itself,
  // with \n, \t, \\ ... escapes decoded (as vLLM does). Special tokens still come from
  // model_dir's tokenizer_config.json when model_dir is not empty.
  static ChatTemplate load(const std::filesystem::path& model_dir, const std::string& file_or_inline);
  static ChatTemplate from_file(const std::filesystem::path& file);
  static ChatTemplate from_string(const std::string& source, const std::string& name = "chat_template");

  // Renders the prompt. `messages` is an array of message objects; `tools` is null or
  // an array of tool definitions; `kwargs` is an object of extra template variables
  // (chat_template_kwargs). Use nlohmann::ordered_json to keep the client's key order
  // (tojson prints keys in that order, like Python); nlohmann::json sorts keys.
  // Throws jinja::TemplateError (a moeserve::Error) on template errors, including the
  // template's own raise_exception() calls, and moeserve::Error for malformed input.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& kwargs) const;
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools, bool add_generation_prompt,
                     const nlohmann::json& kwargs) const;

  // The special-token variables (name, value) the template sees.
  void set_special_tokens(std::vector<std::pair<std::string, std::string>> tokens);
  void set_limits(const jinja::RenderLimits& limits) { limits_ = limits; }

  // Source of the template used without tools (for logging and tests).
  const std::string& source() const;

 private:
  struct Named {
    std::string name;
    std::string source;
    jinja::Template compiled;
  };
  ChatTemplate() = default;
  void add(std::string name, std::string source, const std::string& origin);
  const Named& select(bool has_tools) const;
  template <typename Json>
  std::string render_impl(const Json& messages, const Json& tools, bool add_generation_prompt,
                          const Json& kwargs) const;

  std::vector<Named> templates_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
  jinja::RenderLimits limits_;
};

}  // namespace moeserve::text
