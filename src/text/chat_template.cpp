#include "text/chat_template.h"


#include <fmt/format.h>

#include "core/error.h"
#include "core/file_text.h"
#include "text/jinja/json_convert.h"

namespace moeserve::text {
namespace {

nlohmann::ordered_json read_json(const std::filesystem::path& path) {
  std::string text = read_file_text(path, "chat template file");
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is not valid JSON: {}", path.string(), e.what());
  }
}

// Special tokens as transformers' special_tokens_map exposes them to templates: the
// string, or the "content" of a serialized AddedToken.
std::vector<std::pair<std::string, std::string>> special_tokens_of(const nlohmann::ordered_json& config,
                                                                   const std::filesystem::path& path) {
  static const char* const kKeys[] = {"bos_token", "eos_token",  "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token"};
  std::vector<std::pair<std::string, std::string>> tokens;
  for (const char* key : kKeys) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (it->is_string()) {
      tokens.emplace_back(key, it->get<std::string>());
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      tokens.emplace_back(key, (*it)["content"].get<std::string>());
    } else {
      fail("'{}': \"{}\" must be a string or an object with a string \"content\"", path.string(), key);
    }
  }
  return tokens;
}

// vLLM decodes escapes in an inline --chat-template ("\n" typed on a command line).
std::string decode_inline_escapes(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out.push_back(s[i]);
      continue;
    }
    char e = s[++i];
    switch (e) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      default:
        out.push_back('\\');
        out.push_back(e);
    }
  }
  return out;
}

}  // namespace

void ChatTemplate::add(std::string name, std::string source, const std::string& origin) {
  jinja::Template compiled = jinja::Template::parse(source, origin);
  templates_.push_back(Named{std::move(name), std::move(source), std::move(compiled)});
}

ChatTemplate ChatTemplate::from_string(const std::string& source, const std::string& name) {
  ChatTemplate t;
  t.add("default", source, name);
  return t;
}

ChatTemplate ChatTemplate::from_file(const std::filesystem::path& file) {
  return from_string(read_file_text(file, "chat template file"), file.filename().string());
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir) {
  if (!std::filesystem::is_directory(model_dir)) fail("model directory '{}' does not exist", model_dir.string());
  std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (std::filesystem::exists(config_path)) {
    config = read_json(config_path);
    if (!config.is_object()) fail("'{}' must hold a JSON object", config_path.string());
  }
  ChatTemplate t;
  std::filesystem::path jinja_file = model_dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_file)) {
    t = from_file(jinja_file);
  } else if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      t.add("default", it->get<std::string>(), "tokenizer_config.json:chat_template");
    } else if (it->is_array()) {
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string())
          fail("'{}': each \"chat_template\" entry must be {{\"name\": string, \"template\": string}}",
               config_path.string());
        std::string name = entry["name"].get<std::string>();
        t.add(name, entry["template"].get<std::string>(), "tokenizer_config.json:chat_template[" + name + "]");
      }
      if (t.templates_.empty()) fail("'{}': \"chat_template\" is an empty list", config_path.string());
    } else {
      fail("'{}': \"chat_template\" must be a string or a list of named templates", config_path.string());
    }
  } else {
    fail("no chat template in '{}': it has neither chat_template.jinja nor a \"chat_template\" in "
         "tokenizer_config.json (pass --chat-template)",
         model_dir.string());
  }
  t.special_tokens_ = special_tokens_of(config, config_path);
  return t;
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir, const std::string& file_or_inline) {
  ChatTemplate t;
  std::error_code ec;
  if (std::filesystem::is_regular_file(file_or_inline, ec)) {
    t = from_file(file_or_inline);
  } else if (file_or_inline.find_first_of("{}\n") != std::string::npos) {
    t = from_string(decode_inline_escapes(file_or_inline), "--chat-template");
  } else {
    fail("--chat-template '{}' looks like a file path, but there is no such file", file_or_inline);
  }
  if (!model_dir.empty()) {
    std::filesystem::path config_path = model_dir / "tokenizer_config.json";
    if (std::filesystem::exists(config_path)) {
      nlohmann::ordered_json config = read_json(config_path);
      if (!config.is_object()) fail("'{}' must hold a JSON object", config_path.string());
      t.special_tokens_ = special_tokens_of(config, config_path);
    }
  }
  return t;
}

void ChatTemplate::set_special_tokens(std::vector<std::pair<std::string, std::string>> tokens) {
  special_tokens_ = std::move(tokens);
}

const std::string& ChatTemplate::source() const { return select(false).source; }

const ChatTemplate::Named& ChatTemplate::select(bool has_tools) const {
  if (templates_.size() == 1) return templates_.front();
  auto find = [&](const char* name) -> const Named* {
    for (const auto& t : templates_)
      if (t.name == name) return &t;
    return nullptr;
  };
  if (has_tools)
    if (const Named* t = find("tool_use")) return *t;
  if (const Named* t = find("default")) return *t;
  fail("this model has several chat templates and none is named \"default\"");
}

template <typename Json>
std::string ChatTemplate::render_impl(const Json& messages, const Json& tools, bool add_generation_prompt,
                                      const Json& kwargs) const {
  if (!messages.is_array()) fail("chat template input: 'messages' must be an array");
  if (!tools.is_null() && !tools.is_array()) fail("chat template input: 'tools' must be null or an array");
  if (!kwargs.is_null() && !kwargs.is_object()) fail("chat template input: 'chat_template_kwargs' must be an object");
  using jinja::Value;
  std::vector<std::pair<std::string, Value>> variables;
  for (const auto& [name, token] : special_tokens_) variables.emplace_back(name, Value::string(token));
  if (kwargs.is_object()) {
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
      const std::string& key = it.key();
      if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt")
        fail("chat_template_kwargs may not set '{}'; it is a request field", key);
      variables.emplace_back(key, jinja::from_json(it.value()));
    }
  }
  variables.emplace_back("messages", jinja::from_json(messages));
  variables.emplace_back("tools", jinja::from_json(tools));
  variables.emplace_back("documents", Value::none());
  variables.emplace_back("add_generation_prompt", Value::boolean(add_generation_prompt));
  return select(!tools.is_null()).compiled.render(variables, limits_);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& kwargs) const {
  return render_impl(messages, tools, add_generation_prompt, kwargs);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt, const nlohmann::json& kwargs) const {
  return render_impl(messages, tools, add_generation_prompt, kwargs);
}

}  // namespace moeserve::text
