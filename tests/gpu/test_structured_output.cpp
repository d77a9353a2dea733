// Structured output on the CUDA model: a constrained sequence takes the host path (its logits
// row comes back, the grammar masks it, the host samples), next to the batch's other rows.
// The same check as tests/unit/structured on the CPU model (json_engine_check.h).
#include <gtest/gtest.h>

#include <filesystem>

#include "../unit/structured/json_engine_check.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/qwen35_cuda.h"

namespace moeserve {
namespace {

TEST(CudaStructuredOutput, FixtureModelAnswersFollowTheSchema) {
  if (cuda::list_devices().empty()) GTEST_SKIP() << "no CUDA device";
  const auto dir = std::filesystem::path(MOESERVE_FIXTURES_DIR) / "qwen35" / "hybrid_int4_fp8";
  cuda::CudaModelOptions o;
  o.max_tokens_per_step = 64;
  o.max_seqs = 8;
  o.max_graph_batch = 8;
  o.max_model_len = 256;
  structured::testing::check_json_answers(cuda::Qwen35CudaModel::load(dir, o));
}

}  // namespace
}  // namespace moeserve
