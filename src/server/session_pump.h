// Runs a GenerationSession to its end on an HTTP worker thread, inside a cpp-httplib
// content provider, and notices a client that goes away:
//   - streaming: every write fails once the peer has closed; between outputs the sink's
//     is_writable() (select + a peek at the socket) is polled;
//   - non-streaming: nothing is written until the end, so is_writable() is polled every
//     `poll` interval while waiting.
// Either way the session is cancelled at once, which frees the engine's KV blocks and state
// slots in its next step.
#pragma once
#include <chrono>
#include <functional>
#include <string>

#include <httplib.h>

#include "server/generation_session.h"

namespace moeserve::server {

// Writes `data`; false when the client is gone.
bool sink_write(httplib::DataSink& sink, const std::string& data);

// Waits for every choice to finish. False (session cancelled) if the client disconnected.
bool wait_for_session(GenerationSession& session, httplib::DataSink& sink,
                      std::chrono::milliseconds poll);

// Streams: `render` turns each update into SSE text (possibly empty). False (session
// cancelled) if the client disconnected.
bool stream_session(GenerationSession& session, httplib::DataSink& sink,
                    std::chrono::milliseconds poll,
                    const std::function<std::string(const GenerationSession::ChoiceUpdate&)>& render);

}  // namespace moeserve::server
