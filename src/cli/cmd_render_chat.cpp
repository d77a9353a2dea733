// moeserve render-chat --tokenizer DIR --request FILE.json: prints the prompt the model's
// chat template makes of a chat request (src/text/chat_template.h), and nothing else.
//
// The request file holds "messages", optionally "tools", "add_generation_prompt"
// (default true, like vLLM's chat endpoint) and "chat_template_kwargs".
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "core/file_text.h"
#include "text/chat_template.h"

namespace {

struct RenderChatOptions {
  std::string tokenizer_dir;
  std::string request_file;
  std::string chat_template;
  std::string device = "cpu";
  int threads = 0;
};

nlohmann::ordered_json read_request(const std::string& path) {
  const std::string text = moeserve::read_file_text(path, "request file");
  nlohmann::ordered_json request;
  try {
    request = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    moeserve::fail("request file '{}' is not valid JSON: {}", path, e.what());
  }
  if (!request.is_object()) moeserve::fail("request file '{}' must hold a JSON object", path);
  if (!request.contains("messages")) moeserve::fail("request file '{}' has no \"messages\"", path);
  return request;
}

int run_render_chat(const RenderChatOptions& o) {
  if (o.tokenizer_dir.empty() && o.chat_template.empty())
    moeserve::fail("render-chat needs --tokenizer DIR or --chat-template FILE");
  moeserve::text::ChatTemplate chat_template =
      o.chat_template.empty() ? moeserve::text::ChatTemplate::load(o.tokenizer_dir)
                              : moeserve::text::ChatTemplate::load(o.tokenizer_dir, o.chat_template);
  nlohmann::ordered_json request = read_request(o.request_file);
  nlohmann::ordered_json tools = request.value("tools", nlohmann::ordered_json());
  nlohmann::ordered_json kwargs = request.value("chat_template_kwargs", nlohmann::ordered_json::object());
  bool add_generation_prompt = true;
  if (auto it = request.find("add_generation_prompt"); it != request.end()) {
    if (!it->is_boolean()) moeserve::fail("\"add_generation_prompt\" must be true or false");
    add_generation_prompt = it->get<bool>();
  }
  std::string prompt = chat_template.render(request["messages"], tools, add_generation_prompt, kwargs);
  std::cout.write(prompt.data(), static_cast<std::streamsize>(prompt.size()));
  std::cout.flush();
  return 0;
}

moeserve::cli::Registrar reg{
    "render-chat", "Print the prompt a model's chat template makes of a chat request (messages, tools)",
    [](CLI::App& app) {
      auto o = std::make_shared<RenderChatOptions>();
      app.add_option("--tokenizer", o->tokenizer_dir,
                     "Model or tokenizer directory (chat_template.jinja or tokenizer_config.json)");
      app.add_option("--request", o->request_file,
                     "JSON file: {\"messages\": [...], \"tools\"?: [...], \"add_generation_prompt\"?: bool, "
                     "\"chat_template_kwargs\"?: {...}}")
          ->required();
      app.add_option("--chat-template", o->chat_template, "Template file, or the template text itself");
      app.add_option("--device", o->device, "Accepted like every subcommand; rendering runs on the CPU")
          ->check(CLI::IsMember({"cpu", "cuda"}))
          ->capture_default_str();
      app.add_option("--threads", o->threads, "Accepted like every subcommand; unused")->capture_default_str();
      return [o] { return run_render_chat(*o); };
    }};

}  // namespace
