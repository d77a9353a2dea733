// What the engine reports back for one request, step by step.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::runtime {

enum class FinishReason {
  None,    // still running
  Stop,    // eos, a stop token, or a stop string (the server cancels with Stop)
  Length,  // max_tokens or max_model_len reached
  Abort,   // cancelled, engine shut down, or failed (RequestOutput::error says why)
};
std::string_view to_string(FinishReason reason);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // the k most likely tokens, most likely first
};

// Delivered to the request's callback, in order, from the engine thread.
struct RequestOutput {
  uint64_t request_id = 0;
  std::vector<int32_t> new_tokens;     // usually 1 (more with speculative decoding)
  std::vector<TokenLogprob> logprobs;  // parallel to new_tokens when requested
  // Once, with the first output, when requested: one entry per prompt token; the first is
  // nullopt (nothing precedes it).
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  FinishReason finish = FinishReason::None;  // set on the last output
  std::optional<int32_t> stop_token;   // the eos / stop token that ended it (finish == Stop)
  std::string error;                   // finish == Abort after a failure: what went wrong
  int num_prompt_tokens = 0;
  int num_generated_tokens = 0;        // total so far, including new_tokens
  int num_cached_prompt_tokens = 0;    // prompt tokens served from the prefix cache (0 for now)
};

// Must be cheap and non-blocking (push to a queue): it runs on the engine thread. It must not
// throw; if it does, the engine aborts the request.
using OutputCallback = std::function<void(const RequestOutput&)>;

}  // namespace moeserve::runtime
