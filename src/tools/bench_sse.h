// Incremental parser for a text/event-stream body (Server-Sent Events), as streamed by
// OpenAI-compatible servers. Network chunks split events anywhere: inside a field, between
// "\r" and "\n", or between the two newlines that end an event; the parser keeps the partial
// line and the partial event across feed() calls.
//
// Rules implemented (WHATWG HTML, "Server-sent events", event stream interpretation):
//   - lines end with "\r\n", "\n" or "\r";
//   - an empty line dispatches the event being built (if it has data);
//   - a line starting with ":" is a comment (servers send ": ping" keep-alives);
//   - "name:value" sets a field; one space after the colon is dropped; a line without a
//     colon is a field with an empty value;
//   - "data" lines accumulate, joined with "\n"; "event" sets the type; "id" the last id;
//   - a leading UTF-8 byte-order mark is ignored.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::tools {

struct SseEvent {
  std::string event = "message";  // the "event:" field, "message" when absent
  std::string data;
  std::string id;                 // the last "id:" seen so far in the stream
};

class SseParser {
 public:
  // Parses `bytes` and appends every event completed by them to `out`.
  void feed(std::string_view bytes, std::vector<SseEvent>& out);
  // End of stream. The standard discards an event that was not terminated by an empty line;
  // we dispatch it instead when it has data, because some servers end the body right after
  // the last "data: [DONE]" line.
  void finish(std::vector<SseEvent>& out);

 private:
  void process_line(std::string_view line, std::vector<SseEvent>& out);
  void dispatch(std::vector<SseEvent>& out);

  std::string line_;          // the current, incomplete line
  bool after_cr_ = false;     // the previous byte was "\r": a following "\n" is the same break
  bool at_stream_start_ = true;
  std::string bom_prefix_;    // bytes of a possible BOM seen so far at the stream start
  std::string data_;
  bool has_data_ = false;
  std::string event_type_;
  std::string last_id_;
};

}  // namespace moeserve::tools
