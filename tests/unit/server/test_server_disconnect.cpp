// A client that goes away cancels its engine requests (streaming and not), and a graceful
// shutdown lets running requests finish.
#include "server_fixture.h"

using namespace moeserve::server;
using namespace moeserve::server::testing;
using nlohmann::json;
using moeserve::runtime::FinishReason;

namespace {
bool has_cancel(const FakeEngine& e, FinishReason why) {
  for (auto& [id, w] : e.cancels())
    if (w == why) return true;
  return false;
}
}  // namespace

TEST_F(ServerTest, StreamingClientAbortCancels) {
  start();
  engine_->set_step(std::chrono::milliseconds(2));
  auto c = client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = json({{"prompt", "say: endless FOREVER"}, {"max_tokens", 3000}, {"stream", true}}).dump();
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 4; };
  httplib::Response res;
  httplib::Error err;
  c.send(req, res, err);
  EXPECT_GE(chunks, 4);
  EXPECT_TRUE(engine_drains()) << "the engine still holds the request";
  EXPECT_TRUE(has_cancel(*engine_, FinishReason::Abort));
}

TEST_F(ServerTest, NonStreamingClientTimeoutCancels) {
  start();
  engine_->set_step(std::chrono::milliseconds(2));
  auto c = client();
  c.set_read_timeout(0, 300 * 1000);  // gives up after 0.3 s
  auto r = c.Post("/v1/completions", json({{"prompt", "say: endless FOREVER"}, {"max_tokens", 3000}}).dump(),
                  "application/json");
  EXPECT_FALSE(r);
  c.stop();
  EXPECT_TRUE(engine_drains()) << "the engine still holds the request";
  EXPECT_TRUE(has_cancel(*engine_, FinishReason::Abort));
}

TEST_F(ServerTest, GracefulShutdownFinishesRunningRequests) {
  start();
  engine_->set_step(std::chrono::milliseconds(2));
  std::pair<int, json> result;
  std::thread client_thread([&] {
    result = post("/v1/completions", {{"prompt", "say: endless FOREVER"}, {"max_tokens", 100}});
  });
  while (engine_->live_requests() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server_->begin_shutdown();
  // New connections are refused at once.
  httplib::Client late("127.0.0.1", port_);
  late.set_connection_timeout(1, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(late.Get("/health"));
  client_thread.join();
  EXPECT_EQ(result.first, 200);
  EXPECT_EQ(result.second["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(result.second["usage"]["completion_tokens"], 100);
  thread_.join();  // serve() returned
}

TEST_F(ServerTest, ShutdownRightAfterAHandlerStillAnswersIt) {
  // The signal lands after the handler queued the request but before its response started:
  // the response must still be written in full.
  for (bool stream : {false, true}) {
    start();
    engine_->set_on_submit([this] { server_->begin_shutdown(); });
    auto c = client();
    auto r = c.Post("/v1/completions",
                    json({{"prompt", "say: one two three"}, {"stream", stream}}).dump(), "application/json");
    ASSERT_TRUE(r) << "stream " << stream;
    EXPECT_EQ(r->status, 200);
    if (stream) {
      EXPECT_TRUE(parse_sse(r->body).done);
    } else {
      EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], " one two three");
    }
    thread_.join();
    stop();
  }
}

TEST_F(ServerTest, ShutdownTimeoutAbortsStragglers) {
  auto config = default_config();
  config.shutdown_timeout = std::chrono::seconds(1);
  start(config);
  engine_->set_step(std::chrono::milliseconds(2));
  std::pair<int, SseEvents> result;
  std::thread client_thread([&] {
    result = post_stream("/v1/completions", {{"prompt", "say: endless FOREVER"}, {"max_tokens", 3000}, {"stream", true}});
  });
  while (engine_->live_requests() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto t0 = std::chrono::steady_clock::now();
  server_->begin_shutdown();
  client_thread.join();
  thread_.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  EXPECT_EQ(result.first, 200);
  ASSERT_FALSE(result.second.chunks.empty());
  EXPECT_EQ(result.second.chunks.back()["choices"][0]["finish_reason"], "abort");
  EXPECT_TRUE(result.second.done);
}
