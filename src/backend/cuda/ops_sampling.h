// Sampling on the GPU: picks the next token of logits rows where they were computed, so that
// a decode step copies a few bytes per sequence to the host instead of [vocab] fp32 logits.
//
// The contract is model::DeviceSampleParams (src/model/causal_lm.h), i.e. runtime::Sampler
// for a request without penalties or logit_bias, with the same fp32 arithmetic for every
// decision that does not involve a sum (scaled logits, candidates, their order, top_k), so
// that host and device agree on the token except where the draw or the top_p target falls
// within ~1e-6 (relative) of a cumulative-weight boundary. Logprobs are the log-softmax of
// the raw logits, like runtime::compute_logprobs.
//
// This header is plain C++ (no model headers: they do not compile under nvcc); the glue to
// model::StepOutput is device_sampler.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace moeserve::cuda {

inline constexpr int kSampleMaxLogprobs = 20;  // == model::kMaxDeviceLogprobs
inline constexpr int kSampleMaxMasked = 16;    // == model::kMaxDeviceMaskedTokens

// One row to sample, as model::DeviceSampleParams (same meaning, same values).
struct SampleRowParams {
  int32_t row = 0;  // which row of the logits matrix
  int32_t greedy = 1;
  float inv_temperature = 1.0f;
  float min_log_ratio = -87.0f;
  int32_t top_k = 0;
  int32_t num_logprobs = -1;
  double top_p = 1.0;
  double uniform = 0.0;
  int32_t num_masked = 0;
  int32_t masked[kSampleMaxMasked] = {};
};

struct SampleRowResult {
  int32_t token = -1;  // -1: every logit masked, -inf or NaN
  // How the token was found: 0 the argmax (greedy, or nothing finite), 1 the slices' candidate
  // lists, 2 the one-block passes over the row (ops_sampling.cu).
  int32_t decided_by = 0;
  float logprob = 0.0f;
  int32_t num_top = 0;
  int32_t top_ids[kSampleMaxLogprobs] = {};
  float top_logprobs[kSampleMaxLogprobs] = {};
};

// Scratch of one sampled row, written by the blocks that run before the row's sampling block,
// kSampleBestParts per row, each over one slice of the row (ceil(vocab / parts) rounded up to a
// multiple of 4): the best (value desc, id asc) masked logit of each slice (every row: the
// greedy token and the maximum in one pass spread over the GPU); for rows that sample, each
// slice's candidates (count and fixed-point weight) and its first kSampleSliceKeep candidates in
// candidate order, complete up to slice_bound; for rows that ask for logprobs, each slice's
// log-sum-exp and best logits (ops_sampling.cu).
inline constexpr int kSampleBestParts = 64;
inline constexpr int kSampleSliceKeep = 32;
struct SampleRowScratch {
  float best[kSampleBestParts];
  int32_t best_id[kSampleBestParts];
  uint64_t slice_n[kSampleBestParts];
  uint64_t slice_w[kSampleBestParts];
  uint64_t slice_bound[kSampleBestParts];
  int32_t slice_len[kSampleBestParts];
  uint64_t slice_keys[kSampleBestParts][kSampleSliceKeep];
  // Rows that ask for logprobs: each slice's log-sum-exp pair (Σ exp(x − lp_m) = lp_s over its raw
  // logits) and its kSampleMaxLogprobs best (value desc, id asc).
  float lp_m[kSampleBestParts];
  float lp_s[kSampleBestParts];
  float lp_top_v[kSampleBestParts][kSampleMaxLogprobs];
  int32_t lp_top_i[kSampleBestParts][kSampleMaxLogprobs];
};

// Samples n rows: params[i] (device) names row params[i].row of `logits` (device, fp32
// [rows, vocab], rows contiguous) and results[i] (device) receives its token and logprobs;
// scratch (device, n entries) is the kernels' own. vocab < 2^24. any_sampled false: every row is
// greedy (skips the slices' candidate pass); any_logprobs false: no row asks for logprobs (skips
// their kernel). Asynchronous on `stream`; no allocation.
void sample_rows(const float* logits, int64_t vocab, const SampleRowParams* params, int n, SampleRowResult* results,
                 SampleRowScratch* scratch, bool any_sampled, bool any_logprobs, cudaStream_t stream);

// Whether sampled rows may be decided from the slices' candidate lists (the default) or always take
// the one-block passes over the row; the same tokens either way. A process-wide switch for tests
// and measurements (read at launch).
void set_sampling_from_slices(bool on);

}  // namespace moeserve::cuda
