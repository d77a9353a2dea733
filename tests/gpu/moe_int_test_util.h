// Shared pieces of the integer-form expert tests (test_ops_moe_int.cpp: the public entry and the
// cross-path / refusal checks; test_ops_moe_int_decode.cpp: the dp4a kernels; test_ops_moe_int_mma.cpp:
// the tensor-core kernels): the case, random GPTQ experts and their upload, the guard of
// set_moe_int_decode_max_tokens, one call of cuda::moe_routed_experts_int, and bit comparisons.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/ops_moe.h"
#include "gpu_test_quant.h"
#include "moe_int_reference.h"

namespace moeserve::gputest {

// GPTQ INT4 routed experts: E experts, top-k, hidden H, intermediate I, weight group, symmetric zeros.
struct IntCase {
  int E, k, H, I, group;
  bool sym;
};

// "sym g128 E=16 k=8 H=3072 I=1024" (for SCOPED_TRACE and the printed error lines).
std::string case_name(const IntCase& c);

cuda::MoeShape shape_of(const IntCase& c);

// gate / up [I, H] and down [H, I] of each expert, with their exact fp32 dequantisation.
struct IntExperts {
  std::vector<TestWeight> gate, up, down;
};

// E experts of make_gptq(group, sym, no act-order, scale 0.005), drawn gate, up, down per expert.
IntExperts make_experts(Rng& rng, const IntCase& c);

// The QuantWeights of a list of test weights (for upload_experts and the CPU reference).
std::vector<const quant::QuantWeight*> ptrs(const std::vector<TestWeight>& v);

// The experts as the CPU reference of the form takes them (int_form_moe).
IntFormExperts ref_of(const IntExperts& ex);

// cuda::upload_experts of gate / up / down (no stream).
cuda::DeviceExperts upload(const IntExperts& ex);

// Sets set_moe_int_decode_max_tokens(max_tokens) (0: every step on the tensor-core kernels; 8: steps
// of <= 8 tokens on the dp4a kernels) and restores the previous value when it goes (also on a failed
// ASSERT or a throw).
class DecodeMaxGuard {
 public:
  explicit DecodeMaxGuard(int max_tokens);
  ~DecodeMaxGuard();
  DecodeMaxGuard(const DecodeMaxGuard&) = delete;
  DecodeMaxGuard& operator=(const DecodeMaxGuard&) = delete;

 private:
  int saved_;
};

// A fresh workspace for M tokens (moe_int_workspace_bytes, at least 1 byte), filled with 0xFF bytes:
// NaN as f32, so a value no kernel wrote shows up as a NaN, not as a stale value of an earlier call.
DeviceBuffer<uint8_t> fresh_workspace(const IntCase& c, int M);

// The optional parts of one run_int call.
struct IntRun {
  const std::vector<float>* shared = nullptr;  // [M, H] shared expert output (with gate), or null
  const std::vector<float>* gate = nullptr;    // [M] its gate logits
  int decode_max = -1;                         // set_moe_int_decode_max_tokens for this call; -1: as it is
  DeviceBuffer<uint8_t>* ws = nullptr;         // caller-owned workspace, not refilled; null: fresh_workspace
  int x_offset = 0;                            // x starts this many floats into its device buffer (1: not
                                               // 16-byte aligned)
};

// One call of cuda::moe_routed_experts_int on the default stream for M tokens (x [M, H], router logits
// [M, E], residual [M, H]), synchronised; returns the residual after it, *ran: the call's return value.
// Throws when the device reports an error.
std::vector<float> run_int(const cuda::DeviceExperts& d, const IntCase& c, int M, const std::vector<float>& x,
                           const std::vector<float>& logits, const std::vector<float>& residual, bool* ran,
                           const IntRun& opt = {});

// Every bit the same (NaN payloads and the sign of zero included).
bool bits_equal(float a, float b);

// Elements of got[off .. off + n) that differ in any bit from ref[roff ..]; *first: the first (index
// from off), untouched when none differs.
int count_diffs(const std::vector<float>& got, size_t off, const std::vector<float>& ref, size_t roff, size_t n,
                size_t* first);
// The same over the whole of got (ref at least as long).
int count_diffs(const std::vector<float>& got, const std::vector<float>& ref, size_t* first);

}  // namespace moeserve::gputest
