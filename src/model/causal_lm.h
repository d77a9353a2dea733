// The interface between the runtime (scheduler, sampler, server) and a model on a backend.
//
// One forward call runs one engine step: a batch of sequences, each contributing a chunk of
// new tokens (a prefill chunk, or one decode token, or k+1 tokens to verify). Caches live
// in the model (on its device): a paged KV pool for the full-attention layers, addressed
// through each sequence's block table, and fixed GDN state slots (conv + recurrent state)
// for the linear-attention layers. The runtime owns the allocation of blocks and slots.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/qwen35_config.h"

namespace moeserve::model {

// Sizes the runtime needs to budget memory.
struct CacheGeometry {
  int kv_block_size = 16;          // tokens per KV block
  size_t bytes_per_kv_block = 0;   // one block over all full-attention layers (K and V)
  size_t bytes_per_state_slot = 0; // one sequence's GDN conv + recurrent state, all linear layers
};

// ---- sampling on the model's device (issue 6) -------------------------------------------
// A model whose supports_device_sampling() is true can pick a sequence's next token itself,
// so that the step returns a token instead of a [vocab] row of fp32 logits. The contract is
// runtime::Sampler's (src/runtime/sampler.h) for a request without penalties or logit_bias;
// runtime::Sampler::sample_row is its CPU implementation, and the reference the device
// kernels are tested against. Every field is given exactly as the host sampler computes it
// (runtime::to_device_sample), so both paths see bit-identical fp32 inputs.
inline constexpr int kMaxDeviceLogprobs = 20;
inline constexpr int kMaxDeviceMaskedTokens = 16;

struct DeviceSampleParams {
  // Greedy: argmax of the logits (masked_tokens at -inf), lowest id on ties; the fields down
  // to `uniform` are then unused.
  bool greedy = true;
  // scaled = logit * inv_temperature in fp32, inv_temperature = float(1.0 / temperature).
  float inv_temperature = 1.0f;
  // Candidates: scaled - max(scaled) >= min_log_ratio (fp32), i.e. min_p in log space
  // (runtime::min_p_log_ratio); their weights are expf(scaled - max(scaled)).
  float min_log_ratio = -87.0f;
  // Candidates rank by scaled logit, highest first, lower id on ties.
  int32_t top_k = 0;    // <= 0: off; else the top_k best-ranked candidates and their ties
  double top_p = 1.0;   // then the shortest best-ranked prefix holding >= top_p of the weight
  // The request's draw in [0, 1): the kept tokens are walked in id order, and the first whose
  // running weight exceeds uniform * (their total weight) is the token.
  double uniform = 0.0;
  int32_t num_logprobs = -1;  // -1: none; else 0..kMaxDeviceLogprobs alternatives
  // In-vocabulary ids set to -inf before choosing (min_tokens holds back eos and stop
  // tokens); logprobs still see their raw logits. At most kMaxDeviceMaskedTokens.
  std::span<const int32_t> masked_tokens;
};

struct DeviceSampleResult {
  int32_t token = -1;  // -1: nothing could be chosen (every logit masked, -inf or NaN)
  // When num_logprobs >= 0: log-softmax of the raw logits (NaN as -inf) at `token`, and the
  // num_logprobs most likely tokens, highest first, lowest id on ties.
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

// One sequence's part of a step.
struct SeqStep {
  std::span<const int32_t> tokens;     // new tokens, appended at positions start_pos...
  int64_t start_pos = 0;               // tokens already in this sequence's caches
  std::span<const int32_t> kv_blocks;  // block table covering [0, start_pos + tokens.size())
  int32_t state_slot = -1;             // GDN state slot; holds the state after start_pos tokens
  bool all_logits = false;             // logits for every new token, else only for the last
  // Set (only for a model that supports_device_sampling(), never with all_logits): the model
  // samples the last row itself; StepOutput::samples gets the token and no logits row is
  // returned for this sequence (num_rows 0).
  std::optional<DeviceSampleParams> device_sample;
  // Positions below prompt_len hold prompt tokens (prefill, chunked prefill, teacher-forced
  // scoring); positions at or past it hold generated tokens. A backend may compute the two
  // kinds with different kernels (CUDA: tensor cores for prompt tokens, bandwidth-bound GEMVs
  // for generated ones). The kind belongs to the token, not to the step, so a request's
  // results never depend on the batch it shares. Default: every token is a prompt token.
  int64_t prompt_len = std::numeric_limits<int64_t>::max();
};

struct StepOutput {
  int64_t vocab = 0;
  std::vector<float> logits;           // [rows, vocab] fp32
  std::vector<int64_t> first_row;      // per SeqStep: index of its first row in `logits`
  std::vector<int64_t> num_rows;       // per SeqStep: tokens.size() if all_logits, 0 if device_sample, else 1
  // Per SeqStep when any asked for device_sample (the entries of the others are unused).
  std::vector<DeviceSampleResult> samples;

  // Post-final-norm hidden states (the lm_head input, the MTP seed) of EVERY new token,
  // [Σ tokens.size(), hidden_size] in batch order. Filled only when the caller sets
  // want_hidden before forward (it is a request, not cleared by forward).
  bool want_hidden = false;
  int64_t hidden_size = 0;
  std::vector<float> hidden;
};

// One sequence's part of an MTP draft step (../shared/spec/qwen35_arch.md section 3.4).
// Row i is position p = start_pos + i: it combines the main model's post-norm hidden of
// position p with the token at position p + 1, and its logits predict the token at p + 2.
// The MTP layer has its own K/V pool addressed by the same block ids as the main model's.
struct MtpStep {
  std::span<const float> hidden;         // [n, hidden_size]
  std::span<const int32_t> next_tokens;  // [n]
  int64_t start_pos = 0;                 // MTP K/V already holds positions [0, start_pos)
  std::span<const int32_t> kv_blocks;    // covers [0, start_pos + n)
  bool all_logits = false;               // logits for every row, else only for the last
};

struct MtpOutput {
  int64_t vocab = 0;
  int64_t hidden_size = 0;
  std::vector<float> logits;        // [rows, vocab] draft logits
  std::vector<float> hidden;        // [rows, hidden_size] MTP post-norm output: the hidden of the next draft
  std::vector<int64_t> first_row;   // per MtpStep
  std::vector<int64_t> num_rows;    // per MtpStep
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const io::Qwen35Config& config() const = 0;
  virtual CacheGeometry cache_geometry() const = 0;
  // (Re)allocates the KV pool and the state slots; previous contents are lost.
  virtual void allocate_caches(int num_kv_blocks, int num_state_slots) = 0;
  // Zeroes a state slot: a new sequence starts from it.
  virtual void reset_state(int32_t slot) = 0;
  // Copies one slot's state into another (prefix cache, speculative rollback).
  virtual void copy_state(int32_t src, int32_t dst) = 0;
  // Runs one step. Updates the KV blocks and state slots of every sequence in the batch.
  virtual void forward(std::span<const SeqStep> batch, StepOutput& out) = 0;
  // Prompt positions the model processes in aligned blocks (e.g. the DeltaNet chunked form):
  // a prompt cut into steps at multiples of this computes the same bits as in one step. The
  // scheduler cuts prefill chunks there (SchedulerConfig::prefill_alignment).
  virtual int prefill_alignment() const { return 1; }
  // Whether forward honours SeqStep::device_sample. The runtime sets it only when this says yes.
  virtual bool supports_device_sampling() const { return false; }

  // Multi-token prediction (speculative drafting); models without MTP weights say no.
  virtual bool has_mtp() const { return false; }
  virtual void mtp_forward(std::span<const MtpStep> batch, MtpOutput& out) {
    (void)batch;
    (void)out;
    fail("this model has no MTP weights");
  }
};

}  // namespace moeserve::model
