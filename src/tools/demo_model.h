// The bundled demo model: a small Qwen3.5-MoE checkpoint of the real architecture (Gated
// DeltaNet and gated full-attention layers, routed experts + shared expert, one MTP layer)
// with random weights, the real Qwen3 tokenizer and a Qwen3.5 chat template. It is what
// `scripts/demo.sh` serves, so a fresh machine can run the whole server without downloading
// a checkpoint. Generation is deterministic: the same seed gives the same bytes.
//
// Directory layout (as a Hugging Face text-only checkpoint, `Qwen3_5MoeForCausalLM`):
//   config.json             model_type "qwen3_5_moe_text" (../shared/spec/qwen35_arch.md section 1)
//   generation_config.json
//   model.safetensors       canonical names "model.layers.N....", "lm_head.weight", "mtp.*"
//                           (section 3); BF16, except linear_attn.A_log and
//                           linear_attn.norm.weight in F32 as in the official release (2.9)
//   tokenizer.json          copied byte for byte
//   tokenizer_config.json   the source's, with "chat_template" set to the template used
//   chat_template.jinja     the same template as a file (transformers 5 layout)
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/tensor.h"

namespace moeserve::tools {

// Architecture sizes of a demo model (vocab comes from the tokenizer).
struct DemoModelSize {
  std::string name;
  int64_t hidden = 0, layers = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;          // gated full attention
  int64_t linear_k_heads = 0, linear_v_heads = 0;         // Gated DeltaNet
  int64_t linear_k_dim = 0, linear_v_dim = 0;
  int64_t experts = 0, top_k = 0, moe_intermediate = 0, shared_intermediate = 0;
  int64_t max_position_embeddings = 0;
};
// "tiny" (hidden 64, 4 layers, 8 experts) or "small" (hidden 128, 8 layers, 16 experts).
const DemoModelSize& demo_model_size(const std::string& name);
std::vector<std::string> demo_model_size_names();

enum class ExpertLayout { Fused, PerExpert };

// Ids and vocabulary size read from a tokenizer.json.
struct TokenizerFacts {
  int64_t size = 0;              // one past the largest id (BPE vocabulary and added tokens)
  int64_t endoftext_id = -1;     // "<|endoftext|>": pad, and eos in config.json
  int64_t im_end_id = -1;        // "<|im_end|>": the chat turn end, first generation eos
};
TokenizerFacts read_tokenizer_facts(const nlohmann::json& tokenizer_json, const std::string& source);

// The model's vocab_size: the tokenizer's size rounded up to a multiple of 128, as released
// checkpoints pad theirs (Qwen3.5: 248077 ids, 248320 rows).
int64_t padded_vocab_size(int64_t tokenizer_size);

// How a tensor's values are drawn (seeded per tensor name, see write_demo_model).
struct TensorInit {
  enum class Kind { Normal, LogUniform } kind = Kind::Normal;
  double mean = 0, std = 0;      // Normal: mean + std * N(0, 1)
  double low = 0, high = 0;      // LogUniform: log(U(low, high))
};

struct DemoTensorSpec {
  std::string name;
  DType dtype = DType::BF16;
  Shape shape;
  TensorInit init;
};

// Every tensor of the checkpoint, in file order.
std::vector<DemoTensorSpec> demo_tensor_specs(const DemoModelSize& size, int64_t vocab_size, ExpertLayout layout);

nlohmann::json demo_config_json(const DemoModelSize& size, const TokenizerFacts& tok);
nlohmann::json demo_generation_config_json(const TokenizerFacts& tok);

struct DemoModelOptions {
  std::filesystem::path out_dir;
  uint64_t seed = 0;
  std::filesystem::path tokenizer_dir = "third_party/tokenizers/qwen3";
  std::string size = "tiny";
  // A Jinja chat template file; empty: the tokenizer_config.json's "chat_template".
  std::filesystem::path chat_template;
  ExpertLayout expert_layout = ExpertLayout::Fused;
  bool overwrite = false;        // replace the files of an existing model directory
};

// Writes the model directory. The files are written into a temporary sibling directory
// which is renamed into place, so an interrupted run never leaves a half-written model.
// Throws moeserve::Error naming the file on any problem.
void write_demo_model(const DemoModelOptions& o);

// The values of one tensor (exposed for tests): element i of the tensor named `name` is the
// i-th draw of a generator seeded from (seed, name), so a tensor's values do not depend on
// which other tensors exist.
std::vector<float> demo_tensor_values(const DemoTensorSpec& spec, uint64_t seed);

}  // namespace moeserve::tools
