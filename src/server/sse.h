// Server-sent events as OpenAI streams them: one `data: <json>\n\n` event per chunk and a
// final `data: [DONE]\n\n`.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace moeserve::server {

// Compact JSON; invalid UTF-8 in strings is replaced (U+FFFD), never thrown.
std::string dump_json(const nlohmann::json& value);
std::string sse_event(const nlohmann::json& chunk);
inline const char* sse_done() { return "data: [DONE]\n\n"; }

}  // namespace moeserve::server
