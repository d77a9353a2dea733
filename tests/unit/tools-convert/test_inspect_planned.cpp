// `moeserve inspect --config-only [--weights F] [--int8-lm-head]`: bytes per decoded token of a
// checkpoint planned from config.json alone. The 122B-A10B numbers are worked out here by hand
// from the published shapes (../shared/spec/qwen35_arch.md 1.2, 3.1, 4.1, 4.2); the hybrid with
// an INT8 head must come out near 7.3 GB per token (../shared/spec/anchors.md).
#include <gtest/gtest.h>

#include "convert_test_util.h"
#include "core/error.h"
#include "tools/inspect.h"

namespace moeserve::tools {
namespace {

const std::filesystem::path k122b = std::filesystem::path(MOESERVE_SOURCE_DIR) / "bench/configs/qwen3.5-122b-a10b.json";

// H 3072, 48 layers (36 DeltaNet + 12 attention), 256 experts top 8, I = Is = 1024, V 248320.
constexpr uint64_t H = 3072, L = 48, L_GDN = 36, L_ATT = 12, E = 256, TOPK = 8, I = 1024, V = 248320;
constexpr uint64_t kQkv = 12288, kZ = 8192, kNv = 64, kQ = 16384, kKv = 512, kO = 8192;

// GPTQ INT4, group 128: qweight K/8 x N int32, qzeros K/128 x N/8 int32, scales K/128 x N fp16.
constexpr uint64_t int4_bytes(uint64_t N, uint64_t K) { return K / 8 * N * 4 + K / 128 * N / 8 * 4 + K / 128 * N * 2; }
// FP8 block: N x K bytes + ceil(N/128) x ceil(K/128) F32 scales.
constexpr uint64_t fp8_bytes(uint64_t N, uint64_t K) { return N * K + (N + 127) / 128 * ((K + 127) / 128) * 4; }

TEST(InspectPlanned, Qwen35_122B_HybridWithInt8HeadIsNear7_3GBPerToken) {
  const InspectReport r = inspect_config(k122b, InspectPlan{"hybrid-int4-fp8", 128, true});
  ASSERT_TRUE(r.decode);
  const DecodeBytes& d = *r.decode;
  // Routed experts: 8 of 256 per layer, three [1024 x 3072]-sized INT4 modules each.
  const uint64_t expert = 3 * int4_bytes(I, H);
  EXPECT_EQ(d.routed_experts, expert * E * L * TOPK / E);
  // LM head as INT8 rows + one F32 scale per row; the embedding as one BF16 row.
  EXPECT_EQ(d.lm_head, V * H + V * 4);
  EXPECT_EQ(d.embedding, H * 2);
  // Everything else: FP8 projections, BF16 router / gates / in_proj_a/b / norms / conv taps.
  const uint64_t gdn = fp8_bytes(kQkv, H) + fp8_bytes(kZ, H) + fp8_bytes(H, kZ) + 2 * kNv * H * 2  // in_proj_a/b
                       + kQkv * 4 * 2 + kNv * 2 + kNv * 4 + 128 * 4;  // conv1d, dt_bias, A_log (F32), norm (F32)
  const uint64_t att = fp8_bytes(kQ, H) + 2 * fp8_bytes(kKv, H) + fp8_bytes(H, kO) + 2 * 256 * 2;  // q/k norms
  const uint64_t moe = E * H * 2 + 3 * fp8_bytes(I, H) + H * 2;  // router, shared expert, shared_expert_gate
  const uint64_t layer_norms = 2 * H * 2;
  const uint64_t other = L_GDN * gdn + L_ATT * att + L * (moe + layer_norms) + H * 2 /* final norm */ + d.lm_head;
  EXPECT_EQ(d.other, other);
  EXPECT_EQ(d.total, d.routed_experts + d.embedding + d.other);
  std::printf("  122B hybrid-int4-fp8 + INT8 head: %.4f GB per decoded token (experts %.3f, head %.3f)\n",
              double(d.total) / 1e9, double(d.routed_experts) / 1e9, double(d.lm_head) / 1e9);
  EXPECT_GT(d.total, 7.2e9);
  EXPECT_LT(d.total, 7.4e9);
  // One MTP draft step: its layer (8 of 256 experts) + the head + an embedding row.
  EXPECT_GT(d.mtp_per_draft, d.lm_head + expert * TOPK);
  EXPECT_NE(format_inspect_text(r, false).find("planned: hybrid-int4-fp8 (INT4 group 128) conversion"),
            std::string::npos);
}

TEST(InspectPlanned, FormatsOrderAsExpected) {
  auto total = [](const std::string& weights, bool int8) {
    return inspect_config(k122b, InspectPlan{weights, 128, int8}).decode->total;
  };
  const uint64_t bf16 = total("", false), fp8 = total("fp8-block", false), int4 = total("gptq-int4", false),
                 hybrid = total("hybrid-int4-fp8", false), hybrid8 = total("hybrid-int4-fp8", true);
  // BF16: about 9G parameters read per token (3.6G of experts) -> about 18 GB.
  EXPECT_GT(bf16, 17e9);
  EXPECT_LT(bf16, 19.5e9);
  EXPECT_LT(fp8, bf16 * 0.6);
  EXPECT_LT(int4, fp8);
  EXPECT_LT(int4, hybrid);
  EXPECT_LT(hybrid, fp8);
  EXPECT_EQ(hybrid - hybrid8, V * H * 2 - (V * H + V * 4));  // the head: BF16 -> INT8 rows
  // Without --weights the config-only report is the BF16 release as published.
  const InspectReport r = inspect_config(k122b);
  EXPECT_NE(r.planned.find("official BF16 layout"), std::string::npos);
  EXPECT_EQ(r.decode->lm_head, V * H * 2);
}

TEST(InspectPlanned, Errors) {
  EXPECT_THROW(inspect_config(k122b, InspectPlan{"int3", 128, false}), Error);
  // Like convert, planning starts from an unquantised checkpoint.
  try {
    inspect_checkpoint(testing::fixture("fp8_block"), InspectPlan{"gptq-int4", 32, false});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is already quantised (quantization_config.quant_method 'fp8')"),
              std::string::npos)
        << e.what();
  }
  // A group size that does not divide K names the module.
  try {
    inspect_config(k122b, InspectPlan{"gptq-int4", 100, false});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not divisible by the group size 100"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve::tools
