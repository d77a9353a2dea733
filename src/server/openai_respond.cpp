// OpenAiServer::respond: sends a started session as one JSON body or as an SSE stream.
//
// Both run inside a chunked content provider, which cpp-httplib calls on the connection's
// worker thread after the handler returned: the provider runs the whole session in its first
// call (so a shutdown in the middle does not cut the stream) and watches the client (see
// session_pump.h). Consequence for non-streaming requests: the 200 status line is sent before
// generation, so a request that the engine aborts afterwards (an internal failure, or the
// shutdown timeout) gets its error as the JSON body of that 200 response. Everything a client
// can get wrong is rejected before, with the proper status.
#include <fmt/format.h>

#include "core/log.h"
#include "server/openai_server.h"
#include "server/session_pump.h"
#include "server/sse.h"

namespace moeserve::server {

using nlohmann::json;

namespace {
// An aborted choice with an engine error: the error object the client gets.
std::optional<json> engine_failure(const GenerationSession& session) {
  for (size_t i = 0; i < session.num_choices(); ++i) {
    const auto& d = session.decoder(i);
    if (d.finish_reason() == "abort" && !d.error().empty())
      return ApiError(500, fmt::format("The engine failed this request: {}", d.error())).to_json();
  }
  return std::nullopt;
}
// Runs a content provider body. An exception must not escape into cpp-httplib's worker (it
// would end the process): it is logged, the session cancelled, and the connection closed.
template <typename Body>
httplib::ContentProviderWithoutLength guarded(std::shared_ptr<GenerationSession> session, Body body) {
  return [session, body = std::move(body)](size_t offset, httplib::DataSink& sink) {
    try {
      return body(offset, sink);
    } catch (const std::exception& e) {
      log::error("generation response failed: {}", e.what());
    } catch (...) {
      log::error("generation response failed with an unknown exception");
    }
    session->cancel_all();
    return false;
  };
}

}  // namespace

void OpenAiServer::respond(httplib::Response& res, std::shared_ptr<GenerationSession> session,
                           std::shared_ptr<ResponseBuilder> builder, const GenerationOptions& options) {
  const auto poll = config_.disconnect_poll;
  // If the provider never runs (the client left before the headers went out, or the server
  // is stopping), the releaser still frees the engine's resources.
  auto release = [session](bool) { session->cancel_all(); };

  if (!options.stream) {
    res.set_chunked_content_provider(
        "application/json",
        guarded(session, [session, builder, poll](size_t, httplib::DataSink& sink) {
          if (!wait_for_session(*session, sink, poll)) return false;
          const auto failure = engine_failure(*session);
          const std::string body = dump_json(failure ? *failure : builder->response(*session));
          if (!sink_write(sink, body)) return false;
          sink.done();
          return true;
        }),
        release);
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  const bool include_usage = options.include_usage;
  const bool continuous_usage = options.continuous_usage_stats;
  res.set_chunked_content_provider(
      "text/event-stream",
      guarded(session, [session, builder, poll, include_usage, continuous_usage](size_t, httplib::DataSink& sink) {
        if (!sink_write(sink, builder->stream_head(*session))) {
          session->cancel_all();
          return false;
        }
        const bool completed =
            stream_session(*session, sink, poll, [&](const GenerationSession::ChoiceUpdate& u) {
              auto chunk = builder->update_chunk(*session, u);
              if (!chunk) return std::string();
              if (continuous_usage) (*chunk)["usage"] = session_usage(*session);
              return sse_event(*chunk);
            });
        if (!completed) return false;
        std::string tail;
        if (const auto failure = engine_failure(*session)) tail += sse_event(*failure);
        if (include_usage) tail += sse_event(builder->usage_chunk(session_usage(*session)));
        tail += sse_done();
        if (!sink_write(sink, tail)) return false;
        sink.done();
        return true;
      }),
      release);
}

}  // namespace moeserve::server
