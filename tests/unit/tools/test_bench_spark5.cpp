// The spark5 suite: the exact request bodies of the reference harness, the discarded warm-up
// pass, per-prompt statistics and the /metrics acceptance scrape.
#include <gtest/gtest.h>

#include "fake_openai_server.h"
#include "tools/bench_spark5.h"

using namespace moeserve::tools;
using namespace moeserve::tools::testing;
using json = nlohmann::json;

TEST(Spark5, PromptsAreTheReferenceOnes) {
  // albond/DGX_Spark_Qwen3.5-122B-A10B-AR-INT4 bench_qwen35.sh, quoted in
  // ../shared/spec/reference_project.md section 1.4.
  const auto& p = spark5_prompts();
  ASSERT_EQ(p.size(), 5u);
  EXPECT_STREQ(p[0].text, "What are the main differences between TCP and UDP? Be concise.");
  EXPECT_STREQ(p[1].text,
               "Write a Python function that implements binary search on a sorted list. Include type hints and "
               "docstring.");
  EXPECT_STREQ(p[2].text,
               "Generate a JSON array of 10 fictional employees with fields: name, age, department, salary, "
               "email, skills (array of 3). Output ONLY valid JSON, no explanation.");
  EXPECT_STREQ(p[3].text, "What is 7823 * 4519? Show only the answer.");
  EXPECT_STREQ(p[4].text,
               "Write a complete Python implementation of a red-black tree with insert, delete, search, and "
               "in-order traversal. Include all rotation methods.");
  std::vector<int64_t> max_tokens;
  for (const auto& q : p) max_tokens.push_back(q.max_tokens);
  EXPECT_EQ(max_tokens, (std::vector<int64_t>{256, 512, 1024, 64, 2048}));
}

TEST(Spark5, RunsWarmupThenMeasuredPasses) {
  // The server "generates" max_tokens/8 tokens in (max_tokens/8) ms, except that the Math
  // prompt fails on the second measured pass.
  std::atomic<int> math_calls{0};
  FakeOpenAiServer server([&](const json& body) {
    Script s;
    const int64_t n = body["max_tokens"].get<int64_t>() / 8;
    if (body["max_tokens"] == 64 && ++math_calls == 3) {
      s.status = 500;
      s.json_body = R"({"error":{"message":"boom"}})";
      return s;
    }
    s.delay_ms = int(n);
    s.json_body = json({{"choices", json::array({{{"message", {{"role", "assistant"}, {"content", "x"}}}}})},
                        {"usage", {{"prompt_tokens", 20}, {"completion_tokens", n}}}})
                      .dump();
    return s;
  });
  // Counters before the measured passes, then after: 40 drafts, 30 accepted in between.
  server.set_metrics(
      "# HELP vllm:spec_decode_num_drafts_total x\n"
      "vllm:spec_decode_num_drafts_total{model_name=\"m\"} 100\n"
      "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 150\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 99\n");

  Spark5Options o;
  o.client.base = parse_base_url(server.base_url());
  o.client.timeout_s = 10;
  o.runs = 2;
  Spark5Result r;
  {
    // The scrape after the warm-up reads 100/150; the counters move to 140/180 while the last
    // request is being served, before the final scrape.
    FakeOpenAiServer* srv = &server;
    std::thread flipper([srv] {
      while (srv->bodies().size() < 15) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      srv->set_metrics(
          "vllm:spec_decode_num_drafts_total{model_name=\"m\"} 140\n"
          "vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 180\n");
    });
    r = run_spark5(o, nullptr);
    flipper.join();
  }

  EXPECT_EQ(r.model, "fake-model");
  const auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 15u);  // warm-up + 2 passes
  // Exactly the reference's body, nothing more (no stream flag, no extra sampling fields).
  EXPECT_EQ(bodies[0], json::parse(R"({"model":"fake-model","messages":[{"role":"user","content":
      "What are the main differences between TCP and UDP? Be concise."}],"max_tokens":256,"temperature":0.0})"));
  EXPECT_EQ(bodies[9]["max_tokens"], 2048);

  ASSERT_EQ(r.samples.size(), 15u);
  EXPECT_EQ(r.samples[0].pass, 0);
  EXPECT_EQ(r.samples[14].pass, 2);
  EXPECT_EQ(r.failures, 1);
  ASSERT_EQ(r.prompts.size(), 5u);
  EXPECT_EQ(r.prompts[0].n, 2);
  EXPECT_EQ(r.prompts[3].n, 1);  // one Math sample failed
  EXPECT_EQ(r.prompts[4].mean_completion_tokens, 256);
  EXPECT_EQ(r.prompts[4].mean_prompt_tokens, 20);
  for (const auto& s : r.samples)
    if (s.ok) EXPECT_NEAR(s.tok_per_s, double(s.completion_tokens) / s.elapsed_s, 1e-9);
  // 256 tokens in >= 256 ms: at most 1000 tok/s.
  EXPECT_LE(r.prompts[4].mean, 1000.0);
  EXPECT_GT(r.prompts[4].mean, 100.0);
  double sum = 0;
  for (const auto& p : r.prompts) sum += p.mean;
  EXPECT_NEAR(r.cross_prompt_mean, sum / 5, 1e-9);
  ASSERT_TRUE(r.has_acceptance);
  EXPECT_DOUBLE_EQ(r.mean_acceptance_length, 1.0 + 30.0 / 40.0);
  const json j = spark5_result_json(r, o);
  EXPECT_EQ(j["prompts"].size(), 5u);
  EXPECT_EQ(j["samples"].size(), 15u);
}

TEST(Spark5, SummaryStatistics) {
  Spark5Result r;
  auto add = [&](int pass, const char* name, double rate) {
    Spark5Sample s;
    s.pass = pass;
    s.prompt = name;
    s.ok = true;
    s.tok_per_s = rate;
    s.completion_tokens = 10;
    r.samples.push_back(s);
  };
  add(0, "Q&A", 1000);  // warm-up: ignored
  add(1, "Q&A", 50);
  add(2, "Q&A", 52);
  add(3, "Q&A", 51.5);
  add(1, "Code", 40);
  summarize_spark5(r);
  EXPECT_EQ(r.prompts[0].n, 3);
  EXPECT_NEAR(r.prompts[0].mean, 51.166666666666664, 1e-12);
  EXPECT_DOUBLE_EQ(r.prompts[0].median, 51.5);
  EXPECT_NEAR(r.prompts[0].std, 1.0408329997330663, 1e-12);  // numpy std(ddof=1)
  EXPECT_EQ(r.prompts[1].n, 1);
  EXPECT_EQ(r.prompts[1].std, 0);
  EXPECT_EQ(r.prompts[2].n, 0);
  // Mean over the prompts that have samples.
  EXPECT_NEAR(r.cross_prompt_mean, (51.166666666666664 + 40) / 2, 1e-12);
}

TEST(Spark5, SpecDecodeCounterParsing) {
  double drafts = 0, accepted = 0;
  EXPECT_FALSE(parse_spec_decode_counters("moeserve_requests_total 5\n", drafts, accepted));
  EXPECT_TRUE(parse_spec_decode_counters(
      "vllm:spec_decode_num_drafts_total{engine=\"0\"} 10\n"
      "vllm:spec_decode_num_drafts_total{engine=\"1\"} 5\n"
      "vllm:spec_decode_num_draft_tokens_total 30\n"
      "vllm:spec_decode_num_accepted_tokens_total 20\n"
      "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 12\n",
      drafts, accepted));
  EXPECT_EQ(drafts, 15);
  EXPECT_EQ(accepted, 20);
}
