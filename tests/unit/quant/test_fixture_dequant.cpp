// Exact dequantisation against the transformers fixtures (tests/fixtures/qwen35, made by
// tests/fixtures/make_qwen35_fixtures.py): every `dequant.<module>` tensor of a quantised
// fixture is the weight torch computed from the packed tensors; LinearLoader must find the
// same format and dequantize_rows must give the same fp32 values bit for bit.
#include <cstring>

#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "quant/linear_loader.h"
#include "quant_test_util.h"

namespace moeserve::quant {
namespace {

struct FixtureCase {
  std::string fixture;
  WeightFormat expert_format;  // of the routed experts
  WeightFormat dense_format;   // of the quantised dense modules (attention / GDN / shared expert)
};

std::ostream& operator<<(std::ostream& os, const FixtureCase& c) { return os << c.fixture; }

class FixtureDequant : public ::testing::TestWithParam<FixtureCase> {};

bool bitwise_equal(const std::vector<float>& a, const Tensor& ref) {
  return ref.dtype() == DType::F32 && size_t(ref.numel()) == a.size() &&
         std::memcmp(a.data(), ref.bytes(), a.size() * sizeof(float)) == 0;
}

TEST_P(FixtureDequant, EveryReferenceModuleMatchesBitForBit) {
  const FixtureCase& c = GetParam();
  const auto dir = testing::fixture_dir(c.fixture);
  const io::Checkpoint ckpt = io::Checkpoint::open(dir);
  const io::Qwen35Config config = io::load_qwen35_config(dir);
  const LinearLoader loader(ckpt, config);
  const auto ref = io::SafetensorsFile::open(dir / "reference.safetensors");
  int checked = 0;
  for (const io::TensorInfo& info : ref->tensors()) {
    if (info.name.rfind("dequant.", 0) != 0) continue;
    const std::string module = info.name.substr(8);
    const Tensor expected = ref->tensor(info.name);
    const QuantWeight w = loader.load(module, expected.dim(0), expected.dim(1));
    const bool expert = module.find(".mlp.experts.") != std::string::npos;
    EXPECT_EQ(w.format, expert ? c.expert_format : c.dense_format) << module;
    const std::vector<float> all = testing::dequantize_all(w);
    EXPECT_TRUE(bitwise_equal(all, expected)) << module << ": max diff "
                                              << testing::max_abs_diff(all, expected.to_f32());
    // Any row range gives the same rows (the CPU linear dequantises tiles).
    const int64_t N = w.out_features, K = w.in_features;
    for (int64_t r0 : {int64_t(0), int64_t(3), N / 2}) {
      const int64_t r1 = std::min(N, r0 + 5);
      std::vector<float> part(size_t((r1 - r0) * K));
      w.dequantize_rows(r0, r1, part.data());
      EXPECT_EQ(0, std::memcmp(part.data(), all.data() + r0 * K, part.size() * sizeof(float))) << module;
    }
    ++checked;
  }
  EXPECT_GE(checked, 2) << "fixture " << c.fixture << " has no dequant.* references";
}

INSTANTIATE_TEST_SUITE_P(
    Qwen35, FixtureDequant,
    ::testing::Values(FixtureCase{"int4_autoround_sym", WeightFormat::GptqInt4, WeightFormat::GptqInt4},
                      FixtureCase{"int4_gptq_asym_gidx", WeightFormat::GptqInt4, WeightFormat::Dense},
                      FixtureCase{"fp8_block", WeightFormat::Fp8Block, WeightFormat::Fp8Block},
                      FixtureCase{"hybrid_int4_fp8", WeightFormat::GptqInt4, WeightFormat::Fp8Block},
                      FixtureCase{"nvfp4_compressed_tensors", WeightFormat::Nvfp4, WeightFormat::Nvfp4},
                      FixtureCase{"nvfp4_modelopt", WeightFormat::Nvfp4, WeightFormat::Nvfp4}),
    [](const auto& info) { return info.param.fixture; });

}  // namespace
}  // namespace moeserve::quant
