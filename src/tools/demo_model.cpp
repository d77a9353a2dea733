#include "tools/demo_model.h"

#include <unistd.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/file_text.h"
#include "io/safetensors.h"

namespace moeserve::tools {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  MOESERVE_CHECK(out.good(), "cannot create '{}'", path.string());
  out << text;
  out.close();
  MOESERVE_CHECK(out.good(), "error writing '{}'", path.string());
}

json parse_json_file(const fs::path& path) {
  auto j = json::parse(read_file_text(path), nullptr, false);
  MOESERVE_CHECK(!j.is_discarded() && j.is_object(), "'{}' is not a JSON object", path.string());
  return j;
}

// The M-RoPE split of the rotary half-dimension into (t, h, w) sections, as Qwen3.5 splits
// 32 into [11, 11, 10]. With text only all three use the same positions (section 2.4), but
// the config must carry sections that add up to rotary_dim / 2.
std::vector<int64_t> mrope_sections(int64_t rotary_half) {
  const int64_t base = rotary_half / 3, extra = rotary_half % 3;
  return {base + (extra > 0), base + (extra > 1), base};
}

// The template to ship: the given file, else tokenizer_config.json's "chat_template" (a
// string, or a list of {"name", "template"} of which "default" is taken).
std::string choose_chat_template(const DemoModelOptions& o, const json& tokenizer_config, const fs::path& config_path) {
  if (!o.chat_template.empty()) {
    std::string t = read_file_text(o.chat_template);
    MOESERVE_CHECK(!t.empty(), "the chat template '{}' is empty", o.chat_template.string());
    return t;
  }
  auto it = tokenizer_config.find("chat_template");
  MOESERVE_CHECK(it != tokenizer_config.end(), "'{}' has no \"chat_template\"; pass --chat-template FILE",
                 config_path.string());
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array())
    for (const auto& named : *it)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        return named["template"].get<std::string>();
  fail("'{}': \"chat_template\" is neither a string nor a list with a \"default\" template", config_path.string());
}

void write_weights(const fs::path& path, const DemoModelOptions& o, const DemoModelSize& size, int64_t vocab) {
  const auto specs = demo_tensor_specs(size, vocab, o.expert_layout);
  std::vector<io::SafetensorsWriter::Declaration> decl;
  decl.reserve(specs.size());
  for (const auto& s : specs) decl.push_back({s.name, {s.dtype, s.shape}});
  io::SafetensorsWriter writer(path, std::move(decl),
                               {{"format", "pt"},
                                {"moeserve_demo_model", fmt::format("size={} seed={}", size.name, o.seed)}});
  std::vector<uint16_t> bf16;
  for (const auto& s : specs) {
    const std::vector<float> values = demo_tensor_values(s, o.seed);
    if (s.dtype == DType::F32) {
      writer.write_tensor(s.name, values.data(), values.size() * sizeof(float));
    } else {
      bf16.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) bf16[i] = f32_to_bf16(values[i]);
      writer.write_tensor(s.name, bf16.data(), bf16.size() * sizeof(uint16_t));
    }
  }
  writer.finish();
}

}  // namespace

TokenizerFacts read_tokenizer_facts(const json& tok, const std::string& source) {
  TokenizerFacts f;
  const json* vocab = nullptr;
  if (auto m = tok.find("model"); m != tok.end() && m->is_object())
    if (auto v = m->find("vocab"); v != m->end() && v->is_object()) vocab = &*v;
  MOESERVE_CHECK(vocab != nullptr, "{}: no model.vocab object (expected a BPE tokenizer.json)", source);
  for (const auto& [token, id] : vocab->items()) {
    MOESERVE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "{}: model.vocab[\"{}\"] is not a token id",
                   source, token);
    f.size = std::max(f.size, id.get<int64_t>() + 1);
  }
  if (auto added = tok.find("added_tokens"); added != tok.end()) {
    MOESERVE_CHECK(added->is_array(), "{}: added_tokens is not an array", source);
    for (const auto& a : *added) {
      MOESERVE_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
                         a.contains("content") && a["content"].is_string(),
                     "{}: an added_tokens entry lacks an integer id or a string content", source);
      const int64_t id = a["id"].get<int64_t>();
      f.size = std::max(f.size, id + 1);
      const auto& content = a["content"].get_ref<const std::string&>();
      if (content == "<|endoftext|>") f.endoftext_id = id;
      if (content == "<|im_end|>") f.im_end_id = id;
    }
  }
  MOESERVE_CHECK(f.size > 0, "{}: the vocabulary is empty", source);
  MOESERVE_CHECK(f.endoftext_id >= 0 && f.im_end_id >= 0,
                 "{}: the demo model needs the added tokens <|endoftext|> and <|im_end|> (a Qwen tokenizer)", source);
  return f;
}

json demo_config_json(const DemoModelSize& z, const TokenizerFacts& tok) {
  json layer_types = json::array();
  for (int64_t l = 0; l < z.layers; ++l) layer_types.push_back((l + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  const double partial_rotary_factor = 0.25;
  const auto rotary_dim = int64_t(double(z.head_dim) * partial_rotary_factor);
  return json{
      {"architectures", {"Qwen3_5MoeForCausalLM"}},
      {"model_type", "qwen3_5_moe_text"},
      {"vocab_size", padded_vocab_size(tok.size)},
      {"hidden_size", z.hidden},
      {"num_hidden_layers", z.layers},
      {"layer_types", layer_types},
      {"full_attention_interval", 4},
      {"num_attention_heads", z.heads},
      {"num_key_value_heads", z.kv_heads},
      {"head_dim", z.head_dim},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"rope_parameters",
       {{"rope_type", "default"},
        {"rope_theta", 10000000.0},
        {"partial_rotary_factor", partial_rotary_factor},
        {"mrope_section", mrope_sections(rotary_dim / 2)},
        {"mrope_interleaved", true}}},
      {"partial_rotary_factor", partial_rotary_factor},
      {"linear_conv_kernel_dim", 4},
      {"linear_num_key_heads", z.linear_k_heads},
      {"linear_num_value_heads", z.linear_v_heads},
      {"linear_key_head_dim", z.linear_k_dim},
      {"linear_value_head_dim", z.linear_v_dim},
      {"num_experts", z.experts},
      {"num_experts_per_tok", z.top_k},
      {"moe_intermediate_size", z.moe_intermediate},
      {"shared_expert_intermediate_size", z.shared_intermediate},
      {"output_router_logits", false},
      {"router_aux_loss_coef", 0.001},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-6},
      {"initializer_range", 0.02},
      {"max_position_embeddings", z.max_position_embeddings},
      {"tie_word_embeddings", false},
      {"use_cache", true},
      {"mtp_num_hidden_layers", 1},
      {"mtp_use_dedicated_embeddings", false},
      {"bos_token_id", nullptr},
      {"eos_token_id", tok.endoftext_id},
      {"pad_token_id", tok.endoftext_id},
      {"dtype", "bfloat16"},
  };
}

json demo_generation_config_json(const TokenizerFacts& tok) {
  // Qwen3.5's published sampling defaults (section 1.1), with this tokenizer's stop ids:
  // the chat turn end first, then end-of-text.
  return json{{"do_sample", true},
              {"eos_token_id", {tok.im_end_id, tok.endoftext_id}},
              {"pad_token_id", tok.endoftext_id},
              {"temperature", 1.0},
              {"top_k", 20},
              {"top_p", 0.95}};
}

void write_demo_model(const DemoModelOptions& o) {
  MOESERVE_CHECK(!o.out_dir.empty(), "make-demo-model: no output directory given");
  const DemoModelSize& size = demo_model_size(o.size);
  const fs::path tokenizer_json = o.tokenizer_dir / "tokenizer.json";
  const fs::path tokenizer_config = o.tokenizer_dir / "tokenizer_config.json";
  MOESERVE_CHECK(fs::is_regular_file(tokenizer_json),
                 "no tokenizer at '{}' (run scripts/install-deps.sh, or pass --tokenizer DIR)", tokenizer_json.string());
  MOESERVE_CHECK(fs::is_regular_file(tokenizer_config), "no '{}'", tokenizer_config.string());
  const bool exists = fs::exists(o.out_dir);
  MOESERVE_CHECK(!exists || o.overwrite, "'{}' already exists (pass --overwrite to replace it)", o.out_dir.string());
  MOESERVE_CHECK(!exists || fs::is_directory(o.out_dir), "'{}' exists and is not a directory", o.out_dir.string());

  const std::string tokenizer_text = read_file_text(tokenizer_json);
  const auto tok_json = json::parse(tokenizer_text, nullptr, false);
  MOESERVE_CHECK(!tok_json.is_discarded(), "'{}' is not valid JSON", tokenizer_json.string());
  const TokenizerFacts facts = read_tokenizer_facts(tok_json, tokenizer_json.string());
  json tok_config = parse_json_file(tokenizer_config);
  const std::string chat_template = choose_chat_template(o, tok_config, tokenizer_config);
  tok_config["chat_template"] = chat_template;  // one template, whichever file a loader reads

  // Build next to the destination, then rename: a crash leaves no half-written model.
  const fs::path target = fs::absolute(o.out_dir).lexically_normal();
  fs::create_directories(target.parent_path());
  const fs::path staging = target.parent_path() / fmt::format(".{}.tmp-{}", target.filename().string(), ::getpid());
  fs::remove_all(staging);
  fs::create_directory(staging);
  try {
    write_file(staging / "config.json", demo_config_json(size, facts).dump(2) + "\n");
    write_file(staging / "generation_config.json", demo_generation_config_json(facts).dump(2) + "\n");
    write_file(staging / "tokenizer.json", tokenizer_text);
    write_file(staging / "tokenizer_config.json", tok_config.dump(2) + "\n");
    write_file(staging / "chat_template.jinja", chat_template);
    write_weights(staging / "model.safetensors", o, size, padded_vocab_size(facts.size));
    if (exists) fs::remove_all(target);
    fs::rename(staging, target);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    throw;
  }
}

}  // namespace moeserve::tools
