#include "tools/bench_sse.h"

namespace moeserve::tools {

namespace {
constexpr std::string_view kBom = "\xEF\xBB\xBF";
}

void SseParser::feed(std::string_view bytes, std::vector<SseEvent>& out) {
  size_t i = 0;
  // A BOM may itself be split across chunks: hold back its prefix until decided.
  while (at_stream_start_ && i < bytes.size()) {
    bom_prefix_.push_back(bytes[i++]);
    if (bom_prefix_ == kBom) {
      bom_prefix_.clear();
      at_stream_start_ = false;
    } else if (kBom.substr(0, bom_prefix_.size()) != bom_prefix_) {
      // Not a BOM: the held bytes are ordinary stream content.
      std::string held = std::move(bom_prefix_);
      bom_prefix_.clear();
      at_stream_start_ = false;
      feed(held, out);
    }
  }
  for (; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c == '\n' && after_cr_) {  // second half of "\r\n"
      after_cr_ = false;
      continue;
    }
    after_cr_ = false;
    if (c == '\r' || c == '\n') {
      after_cr_ = (c == '\r');
      process_line(line_, out);
      line_.clear();
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::finish(std::vector<SseEvent>& out) {
  if (!bom_prefix_.empty()) {  // a stream shorter than a BOM
    line_ += bom_prefix_;
    bom_prefix_.clear();
  }
  if (!line_.empty()) {
    process_line(line_, out);
    line_.clear();
  }
  dispatch(out);
}

void SseParser::process_line(std::string_view line, std::vector<SseEvent>& out) {
  if (line.empty()) {
    dispatch(out);
    return;
  }
  if (line.front() == ':') return;  // comment
  std::string_view field = line, value;
  if (auto colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value);
    data_.push_back('\n');
    has_data_ = true;
  } else if (field == "event") {
    event_type_.assign(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) last_id_.assign(value);
  }
  // "retry" and unknown fields are ignored.
}

void SseParser::dispatch(std::vector<SseEvent>& out) {
  if (has_data_) {
    SseEvent ev;
    if (!event_type_.empty()) ev.event = event_type_;
    data_.pop_back();  // the "\n" appended after the last data line
    ev.data = std::move(data_);
    ev.id = last_id_;
    out.push_back(std::move(ev));
  }
  data_.clear();
  has_data_ = false;
  event_type_.clear();
}

}  // namespace moeserve::tools
