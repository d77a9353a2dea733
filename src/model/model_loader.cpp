#include "model/model_loader.h"

#include "core/error.h"
#include "model/qwen35_cpu.h"

namespace moeserve::model {

std::unique_ptr<CausalLM> load_causal_lm(const std::filesystem::path& model_dir, const ModelLoadOptions& options) {
  if (options.device == "cpu")
    return Qwen35CpuModel::load(model_dir, CpuModelOptions{options.threads, options.kv_block_size, options.load_mtp});
  if (options.device == "cuda")
    fail("--device cuda: this build has no CUDA implementation of the model yet; use --device cpu");
  fail("unknown device '{}' (expected cpu or cuda)", options.device);
}

}  // namespace moeserve::model
