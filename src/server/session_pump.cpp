#include "server/session_pump.h"

namespace moeserve::server {

bool sink_write(httplib::DataSink& sink, const std::string& data) {
  if (data.empty()) return sink.is_writable();
  return sink.write(data.data(), data.size());
}

bool wait_for_session(GenerationSession& session, httplib::DataSink& sink,
                      std::chrono::milliseconds poll) {
  while (!session.finished()) {
    session.poll(poll);
    if (!session.finished() && !sink.is_writable()) {
      session.cancel_all();
      return false;
    }
  }
  return true;
}

bool stream_session(GenerationSession& session, httplib::DataSink& sink,
                    std::chrono::milliseconds poll,
                    const std::function<std::string(const GenerationSession::ChoiceUpdate&)>& render) {
  while (!session.finished()) {
    auto updates = session.poll(poll);
    std::string text;
    for (const auto& u : updates) text += render(u);
    const bool alive = text.empty() ? sink.is_writable() : sink.write(text.data(), text.size());
    if (!alive) {
      session.cancel_all();
      return false;
    }
  }
  return true;
}

}  // namespace moeserve::server
