// The step's side of sampling on the GPU: after the LM head has written a chunk of logits
// rows, the rows whose sequence asked for device sampling (model::SeqStep::device_sample)
// are sampled in place by ops_sampling.h and only their tokens (and logprobs) come back; the
// other rows are copied to the host as before.
#pragma once
#include <cstdint>
#include <span>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/ops_sampling.h"
#include "model/causal_lm.h"

namespace moeserve::cuda {

// Where one logits row of a step goes.
struct LogitRowTarget {
  size_t batch_index = 0;  // the SeqStep it belongs to
  int64_t out_row = -1;    // its row of StepOutput::logits; -1: sampled on the device
};

class DeviceRowSampler {
 public:
  // Rows per finish() call at most, and the vocabulary (the logits' row length).
  DeviceRowSampler(int max_rows, int64_t vocab);
  ~DeviceRowSampler();
  DeviceRowSampler(const DeviceRowSampler&) = delete;
  DeviceRowSampler& operator=(const DeviceRowSampler&) = delete;

  // `logits` (device, [targets.size(), vocab] fp32): row i belongs to targets[i]. Device
  // rows fill out.samples[batch_index] (from batch[batch_index].device_sample); host rows
  // are copied through `staging` (pinned, [targets.size(), vocab]) into out.logits.
  // Synchronises `stream`.
  void finish(const float* logits, std::span<const LogitRowTarget> targets, std::span<const model::SeqStep> batch,
              float* staging, model::StepOutput& out, cudaStream_t stream);

 private:
  int max_rows_;
  int64_t vocab_;
  DeviceBuffer<SampleRowParams> params_;
  DeviceBuffer<SampleRowResult> results_;
  DeviceBuffer<SampleRowScratch> scratch_;
  SampleRowParams* params_host_ = nullptr;   // pinned [max_rows]
  SampleRowResult* results_host_ = nullptr;  // pinned [max_rows]
};

// The kernel's form of a request's device-sampling parameters, for row `row` of the logits.
// Throws moeserve::Error when they are outside what the kernel takes.
SampleRowParams to_row_params(const model::DeviceSampleParams& p, int32_t row);

}  // namespace moeserve::cuda
