// Shared helpers of the GPU op tests (tests/gpu/test_ops_*.cpp, test_layerwise.cpp):
// random inputs that are exactly representable in bf16 (so that the CPU op and the CUDA op
// see the same numbers and a comparison measures the op, not the input rounding), host <->
// device copies, step metadata with shuffled block tables, and a comparison that prints
// precise diagnostics (max abs / rel error, the worst element's coordinates, the shape).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/ops_basic.h"
#include "backend/cuda/step_meta.h"
#include "core/dtype.h"

namespace moeserve::gputest {

using cuda::bf16;
using cuda::DeviceBuffer;

// True when a CUDA device is visible (the tests skip otherwise).
bool have_gpu();

#define MOESERVE_REQUIRE_GPU() \
  if (!::moeserve::gputest::have_gpu()) GTEST_SKIP() << "no CUDA device"

// ---- random numbers -------------------------------------------------------------------
// A fast deterministic generator (splitmix64); every test seeds its own.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [lo, hi].
  int64_t integer(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
  // Approximately normal (sum of four uniforms, variance matched): cheap and bounded.
  float normal() { return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f; }

 private:
  uint64_t s_;
};

inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
void round_bf16_inplace(std::vector<float>& v);

// n values ~ N(0, scale²) rounded to bf16 (exactly representable on both sides).
std::vector<float> random_bf16(Rng& rng, size_t n, float scale);
// n values uniform in [lo, hi) rounded to bf16.
std::vector<float> random_bf16_uniform(Rng& rng, size_t n, float lo, float hi);
// n fp32 values ~ N(0, scale²) (for f32 parameters and f32 residuals).
std::vector<float> random_f32(Rng& rng, size_t n, float scale);

// ---- device copies --------------------------------------------------------------------
// Values are rounded to bf16 (callers pass bf16-representable values when the comparison
// must not see input rounding).
DeviceBuffer<bf16> to_device_bf16(const std::vector<float>& v);
DeviceBuffer<float> to_device_f32(const std::vector<float>& v);
DeviceBuffer<int32_t> to_device_i32(const std::vector<int32_t>& v);
std::vector<float> to_host(const DeviceBuffer<bf16>& d);
std::vector<float> to_host(const DeviceBuffer<float>& d);
std::vector<int32_t> to_host(const DeviceBuffer<int32_t>& d);
// Waits for the device and throws on an asynchronous kernel error.
void sync_device();

// ---- comparison -----------------------------------------------------------------------
// Unit roundoff of fp32 and of bf16 (half an ulp at the bottom of a binade, relative).
constexpr double kEpsF32 = 5.9604644775390625e-8;  // 2^-24
constexpr double kEpsBf16 = 3.90625e-3;            // 2^-8

struct ErrorStats {
  double max_abs = 0;      // max |got − ref|
  double max_ref = 0;      // max |ref|
  double rel = 0;          // max_abs / max_ref (the repository's usual metric)
  double rms_rel = 0;      // ||got − ref||₂ / ||ref||₂
  size_t worst = 0;        // flat index of the element with the largest |got − ref| / bound
  size_t violations = 0;   // elements with |got − ref| > bound
  double worst_ratio = 0;  // largest |got − ref| / bound
};

// Element i passes when |got_i − ref_i| <= atol + rtol·|ref_i| (+ bound_i when given).
// `what` names the tensor and `dims` / `dim_names` its shape; on failure the message gives
// the counts, max abs/rel errors, and the worst element's coordinates and values. A summary
// line "[what] ..." is printed either way so that a GPU run records the measured errors.
::testing::AssertionResult all_close(const std::string& what, const std::vector<float>& got,
                                     const std::vector<float>& ref, const std::vector<int64_t>& dims,
                                     const std::vector<std::string>& dim_names, double atol, double rtol,
                                     const std::vector<float>* bound = nullptr);
ErrorStats error_stats(const std::vector<float>& got, const std::vector<float>& ref);
// "[a, b, c]" coordinates of a flat index.
std::string coords(size_t flat, const std::vector<int64_t>& dims);
std::string shape_str(const std::vector<int64_t>& dims, const std::vector<std::string>& names);

// Per-element bound of an fp32 dot product of length k whose terms have absolute sum
// absdot, summed in another order than the reference: c·sqrt(k)·eps·absdot (the typical
// random-walk growth of rounding errors, with c = 8 as a safety factor, far below the size
// of any one term for the k used here, so an off-by-one in the reduction still fails).
std::vector<float> dot_bounds(const std::vector<float>& absdot, int64_t k);

// ---- step metadata --------------------------------------------------------------------
struct SeqSpec {
  int start_pos = 0;   // tokens already cached
  int num_tokens = 0;  // new tokens in this step
  int state_slot = 0;
  std::vector<int32_t> blocks;  // block table (covers start_pos + num_tokens)
};

// Gives every sequence a block table covering `lens[i]` positions with physical blocks drawn
// from a shuffled pool (no two sequences share a block). Returns the pool size.
int assign_shuffled_blocks(Rng& rng, std::vector<SeqSpec>& seqs, int block_size, int spare_blocks = 3);

// StepMeta on the device for a list of sequences (tokens laid out in sequence order).
class DeviceStepMeta {
 public:
  DeviceStepMeta(const std::vector<SeqSpec>& seqs, int max_blocks_per_seq);
  const cuda::StepMeta& meta() const { return meta_; }
  int num_tokens() const { return meta_.num_tokens; }
  // Host copies, for building the CPU side.
  std::vector<int32_t> token_pos, token_seq, seq_token_start;

 private:
  DeviceBuffer<int32_t> token_seq_, token_pos_, seq_token_start_, seq_start_pos_, seq_state_slot_, block_tables_;
  cuda::StepMeta meta_{};
};

}  // namespace moeserve::gputest
