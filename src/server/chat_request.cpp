#include "server/chat_request.h"

#include <fmt/format.h>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_fields.h"
#include "text/tool_parser_schema.h"

namespace moeserve::server {

using nlohmann::json;

namespace {

// `content`: a string, null, or an array of text parts ({"type": "text", "text": ...}),
// joined with newlines (vLLM's "string" content format).
json normalize_content(const JsonFields& m, bool allow_null) {
  const json* content = m.get("content");
  const std::string param = m.param("content");
  if (!content) {
    if (allow_null) return nullptr;
    throw_bad_request(fmt::format("`{}` is required", param), param);
  }
  if (content->is_string()) return *content;
  if (!content->is_array())
    throw_bad_request(fmt::format("`{}` must be a string or an array of content parts, got {}", param,
                                  json_type_name(*content)),
                      param);
  std::string joined;
  for (size_t i = 0; i < content->size(); ++i) {
    JsonFields part((*content)[i], fmt::format("{}[{}].", param, i));
    const std::string type = part.required_string("type");
    if (type != "text" && type != "input_text")
      throw_bad_request(fmt::format("`{}` content parts of type `{}` are not supported (this model "
                                    "reads text only)",
                                    part.param("type"), type),
                        part.param("type"));
    if (i) joined += "\n";
    joined += part.required_string("text");
  }
  return joined;
}

json normalize_tool_calls(const json& calls, const std::string& param) {
  if (!calls.is_array())
    throw_bad_request(fmt::format("`{}` must be an array, got {}", param, json_type_name(calls)), param);
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    JsonFields call(calls[i], fmt::format("{}[{}].", param, i));
    const json* fn = call.object("function");
    if (!fn) throw_bad_request(fmt::format("`{}` is required", call.param("function")), call.param("function"));
    JsonFields f(*fn, call.param("function."));
    json normalized = {{"type", call.string("type").value_or("function")},
                       {"function", {{"name", f.required_string("name")}}}};
    if (auto id = call.string("id")) normalized["id"] = *id;
    // Templates index arguments as a mapping: parse the JSON text the client sends back.
    if (const json* args = f.get("arguments")) {
      if (args->is_string()) {
        json parsed = json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
        normalized["function"]["arguments"] =
            parsed.is_object() ? parsed : *args;
      } else if (args->is_object()) {
        normalized["function"]["arguments"] = *args;
      } else {
        throw_bad_request(fmt::format("`{}` must be a JSON string or object", f.param("arguments")),
                          f.param("arguments"));
      }
    } else {
      normalized["function"]["arguments"] = json::object();
    }
    out.push_back(std::move(normalized));
  }
  return out;
}

json normalize_message(const json& raw, size_t index) {
  JsonFields m(raw, fmt::format("messages[{}].", index));
  std::string role = m.required_string("role");
  if (role == "developer") role = "system";  // OpenAI's newer name for the system role
  json out = {{"role", role}};
  if (role == "system" || role == "user") {
    out["content"] = normalize_content(m, false);
  } else if (role == "assistant") {
    out["content"] = normalize_content(m, true);
    if (const json* calls = m.get("tool_calls")) {
      json normalized = normalize_tool_calls(*calls, m.param("tool_calls"));
      if (!normalized.empty()) out["tool_calls"] = std::move(normalized);
    }
    // vLLM accepts both names; the Qwen templates read reasoning_content.
    auto reasoning = m.string("reasoning_content");
    if (!reasoning) reasoning = m.string("reasoning");
    if (reasoning) out["reasoning_content"] = *reasoning;
    if (out["content"].is_null() && !out.contains("tool_calls") && !reasoning)
      throw_bad_request(fmt::format("`{}` needs `content` or `tool_calls`", m.param("role")),
                        m.param("content"));
  } else if (role == "tool") {
    out["content"] = normalize_content(m, false);
    if (auto id = m.string("tool_call_id")) out["tool_call_id"] = *id;
  } else {
    throw_bad_request(fmt::format("`{}` must be one of system, developer, user, assistant, tool; got `{}`",
                                  m.param("role"), role),
                      m.param("role"));
  }
  if (auto name = m.string("name")) out["name"] = *name;
  return out;
}

void parse_tools(const JsonFields& f, ChatRequest& r) {
  const json* tools = f.array("tools");
  if (!tools || tools->empty()) return;
  for (size_t i = 0; i < tools->size(); ++i) {
    JsonFields tool((*tools)[i], fmt::format("tools[{}].", i));
    const std::string type = tool.string("type").value_or("function");
    if (type != "function")
      throw_bad_request(fmt::format("`{}` must be \"function\", got `{}`", tool.param("type"), type),
                        tool.param("type"));
    const json* fn = tool.object("function");
    if (!fn) throw_bad_request(fmt::format("`{}` is required", tool.param("function")), tool.param("function"));
    JsonFields func(*fn, tool.param("function."));
    func.required_string("name");
    func.string("description");
    func.object("parameters");
  }
  try {
    (void)text::ToolSchemas::from_json(*tools);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw_bad_request(e.what(), "tools");
  }
  r.tools = *tools;
}

void parse_tool_choice(const JsonFields& f, const ToolSettings& settings, ChatRequest& r) {
  const bool has_tools = !r.tools.is_null();
  const json* choice = f.get("tool_choice");
  if (!choice) {
    r.tool_choice = has_tools ? ToolChoice::Auto : ToolChoice::None;
  } else if (choice->is_string()) {
    const std::string s = choice->get<std::string>();
    if (s == "none") r.tool_choice = ToolChoice::None;
    else if (s == "auto") r.tool_choice = ToolChoice::Auto;
    else if (s == "required") r.tool_choice = ToolChoice::Required;
    else
      throw_bad_request(fmt::format("`tool_choice` must be \"none\", \"auto\", \"required\" or a "
                                    "function object; got \"{}\"",
                                    s),
                        "tool_choice");
  } else if (choice->is_object()) {
    JsonFields c(*choice, "tool_choice.");
    const json* fn = c.object("function");
    if (!fn) throw_bad_request("`tool_choice.function` is required", "tool_choice.function");
    r.named_tool = JsonFields(*fn, "tool_choice.function.").required_string("name");
    r.tool_choice = ToolChoice::Named;
  } else {
    throw_bad_request(fmt::format("`tool_choice` must be a string or an object, got {}",
                                  json_type_name(*choice)),
                      "tool_choice");
  }

  if (r.tool_choice != ToolChoice::None && !has_tools)
    throw_bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice");
  if (r.tool_choice == ToolChoice::Auto &&
      !(settings.enable_auto_tool_choice && !settings.tool_call_parser.empty()))
    throw_bad_request("\"auto\" tool choice requires --enable-auto-tool-choice and "
                      "--tool-call-parser to be set",
                      "tool_choice");
  if ((r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named) &&
      settings.tool_call_parser.empty())
    throw_bad_request("\"required\" and named tool choices require --tool-call-parser to be set",
                      "tool_choice");
  if (r.tool_choice == ToolChoice::Named) {
    bool found = false;
    for (const auto& tool : r.tools)
      if (tool.contains("function") && tool["function"].value("name", "") == r.named_tool) found = true;
    if (!found)
      throw_bad_request(fmt::format("Tool '{}' has not been passed in `tools`.", r.named_tool),
                        "tool_choice");
  }
}

}  // namespace

ChatRequest parse_chat_request(const json& body, const std::vector<std::string>& served_names,
                               const RequestLimits& limits, const ToolSettings& tools,
                               const json& default_chat_template_kwargs,
                               const SamplingDefaults& sampling_defaults) {
  JsonFields f(body);
  ChatRequest r;
  r.model = resolve_model(f, served_names);

  const json* messages = f.array("messages");
  if (!messages) throw_bad_request("`messages` is required", "messages");
  if (messages->empty()) throw_bad_request("`messages` must not be empty", "messages");
  for (size_t i = 0; i < messages->size(); ++i)
    r.messages.push_back(normalize_message((*messages)[i], i));

  parse_tools(f, r);
  parse_tool_choice(f, tools, r);
  if (auto v = f.boolean("parallel_tool_calls")) r.parallel_tool_calls = *v;

  if (f.has("chat_template"))
    throw_bad_request("a per-request `chat_template` is not accepted; start the server with "
                      "--chat-template instead",
                      "chat_template");
  r.chat_template_kwargs = default_chat_template_kwargs.is_object() ? default_chat_template_kwargs
                                                                    : json::object();
  if (const json* kwargs = f.object("chat_template_kwargs"))
    for (const auto& [key, value] : kwargs->items()) r.chat_template_kwargs[key] = value;
  if (auto effort = f.string("reasoning_effort")) r.chat_template_kwargs["reasoning_effort"] = *effort;
  if (auto v = f.boolean("add_generation_prompt")) r.add_generation_prompt = *v;
  if (auto v = f.boolean("continue_final_message")) r.continue_final_message = *v;
  if (r.add_generation_prompt && r.continue_final_message)
    throw_bad_request("`continue_final_message` and `add_generation_prompt` cannot both be true",
                      "continue_final_message");
  if (r.continue_final_message && r.messages.back()["role"] != "assistant")
    throw_bad_request("`continue_final_message` needs the last message to be an assistant message",
                      "continue_final_message");

  r.generation = parse_generation_options(f, limits, Endpoint::Chat, sampling_defaults);
  return r;
}

}  // namespace moeserve::server
