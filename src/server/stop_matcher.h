// Stop strings (OpenAI `stop`) on streamed text. Text arrives in pieces (one detokenized
// delta per engine output); a stop string can span pieces, so the matcher holds back the
// longest tail that could still be the start of a stop string and releases it once it
// cannot. When a stop string appears, the text before it is released and generation ends
// (the server then cancels the engine request with finish reason "stop").
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::server {

class StopStringMatcher {
 public:
  // Empty strings in `stops` are ignored. With include_stop (vLLM's
  // include_stop_str_in_output) the matched stop string is part of the released text.
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop = false);

  struct Result {
    std::string text;                    // safe to send now
    std::optional<std::string> stopped;  // the stop string that ended generation
  };

  // Appends a piece of text. After a stop, further calls return nothing.
  Result feed(std::string_view piece);
  // End of generation without a stop: releases what was held back.
  std::string flush();

  bool active() const { return !stops_.empty(); }
  bool stopped() const { return stopped_; }
  const std::string& held_back() const { return pending_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_;
  bool stopped_ = false;
  std::string pending_;
};

}  // namespace moeserve::server
