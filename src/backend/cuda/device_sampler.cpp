#include "backend/cuda/device_sampler.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_check.h"

namespace moeserve::cuda {

static_assert(kSampleMaxLogprobs == model::kMaxDeviceLogprobs);
static_assert(kSampleMaxMasked == model::kMaxDeviceMaskedTokens);

SampleRowParams to_row_params(const model::DeviceSampleParams& p, int32_t row) {
  MOESERVE_CHECK(p.num_logprobs >= -1 && p.num_logprobs <= kSampleMaxLogprobs,
                 "device sampling: {} logprobs asked, at most {}", p.num_logprobs, kSampleMaxLogprobs);
  MOESERVE_CHECK(p.masked_tokens.size() <= size_t(kSampleMaxMasked), "device sampling: {} masked tokens, at most {}",
                 p.masked_tokens.size(), kSampleMaxMasked);
  MOESERVE_CHECK(p.greedy || (p.inv_temperature > 0.0f && p.uniform >= 0.0 && p.uniform < 1.0),
                 "device sampling: inverse temperature {} and uniform {} must be positive and in [0, 1)",
                 p.inv_temperature, p.uniform);
  SampleRowParams r;
  r.row = row;
  r.greedy = p.greedy ? 1 : 0;
  r.inv_temperature = p.inv_temperature;
  r.min_log_ratio = p.min_log_ratio;
  r.top_k = p.top_k;
  r.num_logprobs = p.num_logprobs;
  r.top_p = p.top_p;
  r.uniform = p.uniform;
  r.num_masked = int32_t(p.masked_tokens.size());
  std::copy(p.masked_tokens.begin(), p.masked_tokens.end(), r.masked);
  return r;
}

DeviceRowSampler::DeviceRowSampler(int max_rows, int64_t vocab)
    : max_rows_(std::max(1, max_rows)), vocab_(vocab), params_(size_t(max_rows_)), results_(size_t(max_rows_)),
      scratch_(size_t(max_rows_)) {
  MOESERVE_CUDA_CHECK(cudaMallocHost(&params_host_, size_t(max_rows_) * sizeof(SampleRowParams)));
  MOESERVE_CUDA_CHECK(cudaMallocHost(&results_host_, size_t(max_rows_) * sizeof(SampleRowResult)));
}

DeviceRowSampler::~DeviceRowSampler() {
  if (params_host_) cudaFreeHost(params_host_);
  if (results_host_) cudaFreeHost(results_host_);
}

void DeviceRowSampler::finish(const float* logits, std::span<const LogitRowTarget> targets,
                              std::span<const model::SeqStep> batch, float* staging, model::StepOutput& out,
                              cudaStream_t stream) {
  const size_t n = targets.size();
  MOESERVE_CHECK(n <= size_t(max_rows_), "device sampling: {} rows in one pass, at most {}", n, max_rows_);
  const size_t V = size_t(vocab_);
  int nd = 0;
  bool any_logprobs = false, any_sampled = false;
  for (size_t i = 0; i < n; ++i) {
    const LogitRowTarget& t = targets[i];
    if (t.out_row >= 0) continue;
    MOESERVE_CHECK(t.batch_index < batch.size() && batch[t.batch_index].device_sample,
                   "device sampling: row {} has no sampling parameters", i);
    params_host_[nd] = to_row_params(*batch[t.batch_index].device_sample, int32_t(i));
    any_logprobs = any_logprobs || params_host_[nd].num_logprobs >= 0;
    any_sampled = any_sampled || !params_host_[nd].greedy;
    ++nd;
  }
  if (nd > 0) {
    MOESERVE_CUDA_CHECK(cudaMemcpyAsync(params_.data(), params_host_, size_t(nd) * sizeof(SampleRowParams),
                                        cudaMemcpyHostToDevice, stream));
    sample_rows(logits, vocab_, params_.data(), nd, results_.data(), scratch_.data(), any_sampled, any_logprobs,
                stream);
    MOESERVE_CUDA_CHECK(cudaMemcpyAsync(results_host_, results_.data(), size_t(nd) * sizeof(SampleRowResult),
                                        cudaMemcpyDeviceToHost, stream));
  }
  // Host rows, in runs of consecutive rows.
  for (size_t i = 0; i < n;) {
    if (targets[i].out_row < 0) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < n && targets[j].out_row >= 0) ++j;
    MOESERVE_CUDA_CHECK(cudaMemcpyAsync(staging + i * V, logits + i * V, (j - i) * V * sizeof(float),
                                        cudaMemcpyDeviceToHost, stream));
    i = j;
  }
  MOESERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (nd > 0 && out.samples.size() < batch.size()) out.samples.resize(batch.size());
  int k = 0;
  for (size_t i = 0; i < n; ++i) {
    const LogitRowTarget& t = targets[i];
    if (t.out_row >= 0) {
      std::memcpy(out.logits.data() + size_t(t.out_row) * V, staging + i * V, V * sizeof(float));
      continue;
    }
    const bool wants_logprobs = params_host_[k].num_logprobs >= 0;
    const SampleRowResult& r = results_host_[k++];
    model::DeviceSampleResult& s = out.samples[t.batch_index];
    s.token = r.token;
    s.top.clear();
    // The kernels fill logprob and top only for rows that ask for them (the other rows' fields
    // hold whatever the buffer held before): report nothing for those.
    s.logprob = wants_logprobs ? r.logprob : 0.0f;
    if (wants_logprobs)
      for (int j = 0; j < std::clamp(r.num_top, 0, kSampleMaxLogprobs); ++j)
        s.top.emplace_back(r.top_ids[j], r.top_logprobs[j]);
  }
}

}  // namespace moeserve::cuda
