// Checkpoint: file discovery (single, sharded with index, loose files, mtp.safetensors), name
// normalisation (../shared/spec/qwen35_arch.md 3.1-3.3) and typed access.
#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io_test_util.h"

namespace moeserve::io {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_file;

Tensor f32(std::vector<float> v, Shape s) { return Tensor::from_f32(v, std::move(s)); }

TEST(CanonicalTensorName, FollowsTheSpecPrefixRules) {
  const std::vector<std::pair<std::string, std::optional<std::string>>> cases = {
      {"model.language_model.layers.3.mlp.gate.weight", "layers.3.mlp.gate.weight"},
      {"model.embed_tokens.weight", "embed_tokens.weight"},
      {"model.norm.weight", "norm.weight"},
      {"language_model.model.layers.0.linear_attn.A_log", "layers.0.linear_attn.A_log"},
      {"model.language_model.embed_tokens.weight", "embed_tokens.weight"},
      {"model.layers.1.mlp.experts.gate_up_proj", "layers.1.mlp.experts.gate_up_proj"},
      {"lm_head.weight", "lm_head.weight"},
      {"language_model.lm_head.weight", "lm_head.weight"},
      {"mtp.fc.weight", "mtp.fc.weight"},
      {"mtp.layers.0.mlp.experts.7.up_proj.weight", "mtp.layers.0.mlp.experts.7.up_proj.weight"},
      {"model.visual.blocks.0.attn.qkv.weight", std::nullopt},
      {"visual.merger.mlp.0.weight", std::nullopt},
      // "model.language_model." is stripped before "model.", not as "model." + "language_model.".
      {"model.language_model.norm.weight", "norm.weight"},
  };
  for (const auto& [source, expected] : cases) EXPECT_EQ(canonical_tensor_name(source), expected) << source;
}

TEST(Checkpoint, SingleFileWithCompositePrefixes) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors",
                    {{"model.language_model.embed_tokens.weight", f32({1, 2, 3, 4, 5, 6}, {3, 2})},
                     {"model.language_model.norm.weight", f32({0.5f, 0.25f}, {2})},
                     {"model.language_model.layers.0.mlp.gate.weight", f32({7, 8}, {1, 2})},
                     {"model.language_model.layers.10.mlp.gate.weight", f32({9, 10}, {1, 2})},
                     {"lm_head.weight", f32({1, 1, 1, 1, 1, 1}, {3, 2})},
                     {"model.visual.patch_embed.proj.weight", f32({1}, {1})},
                     {"mtp.fc.weight", f32({1, 2, 3, 4}, {2, 2})}});
  Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.dir(), dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"embed_tokens.weight", "layers.0.mlp.gate.weight",
                                                    "layers.10.mlp.gate.weight", "lm_head.weight",
                                                    "mtp.fc.weight", "norm.weight"}));
  EXPECT_TRUE(ckpt.has("norm.weight"));
  EXPECT_FALSE(ckpt.has("model.language_model.norm.weight"));
  EXPECT_FALSE(ckpt.has("visual.patch_embed.proj.weight"));
  EXPECT_EQ(ckpt.get("embed_tokens.weight").to_f32(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ckpt.get("norm.weight", DType::F32, {2}).to_f32(), (std::vector<float>{0.5f, 0.25f}));
  EXPECT_EQ(ckpt.get_float("mtp.fc.weight", {2, 2}).to_f32(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(ckpt.source_of("norm.weight"), "model.safetensors: model.language_model.norm.weight");
  EXPECT_EQ(ckpt.names_with_prefix("layers.1"), (std::vector<std::string>{"layers.10.mlp.gate.weight"}));
  EXPECT_EQ(ckpt.names_with_prefix("layers."),
            (std::vector<std::string>{"layers.0.mlp.gate.weight", "layers.10.mlp.gate.weight"}));
  EXPECT_TRUE(ckpt.names_with_prefix("zzz").empty());
  EXPECT_EQ(ckpt.info("lm_head.weight").shape, (Shape{3, 2}));
  EXPECT_EQ(ckpt.files().size(), 1u);
}

TEST(Checkpoint, TypedAccessErrorsNameFileTensorExpectedAndGot) {
  TempDir dir;
  Tensor bf = Tensor::empty(DType::BF16, {4, 2});
  Tensor i32 = Tensor::empty(DType::I32, {2});
  write_safetensors(dir / "model.safetensors",
                    {{"model.layers.0.self_attn.q_proj.weight", bf}, {"model.layers.0.x.qweight", i32}});
  Checkpoint ckpt = Checkpoint::open(dir.path());
  expect_error([&] { ckpt.get("layers.0.self_attn.k_proj.weight"); },
               {"checkpoint " + dir.path().string() + ": missing tensor layers.0.self_attn.k_proj.weight"});
  expect_error([&] { ckpt.get("layers.0.self_attn.q_proj.weight", DType::BF16, {2, 4}); },
               {dir.path().string(), "model.safetensors: model.layers.0.self_attn.q_proj.weight",
                "expected BF16 [2, 4], got BF16 [4, 2]"});
  expect_error([&] { ckpt.get("layers.0.self_attn.q_proj.weight", DType::F32, {4, 2}); },
               {"expected F32 [4, 2], got BF16 [4, 2]"});
  EXPECT_EQ(ckpt.get("layers.0.self_attn.q_proj.weight", DType::BF16, {4, 2}).shape(), (Shape{4, 2}));
  EXPECT_EQ(ckpt.get_float("layers.0.self_attn.q_proj.weight", {4, 2}).dtype(), DType::BF16);
  expect_error([&] { ckpt.get_float("layers.0.x.qweight", {2}); },
               {"layers.0.x.qweight", "model.safetensors: model.layers.0.x.qweight", "BF16/F16/F32", "got I32 [2]"});
  expect_error([&] { ckpt.get_float("layers.0.self_attn.q_proj.weight", {8}); }, {"shape [8]", "got BF16 [4, 2]"});
  expect_error([&] { ckpt.source_of("nope"); }, {"missing tensor nope"});
}

// Writes a two-shard checkpoint with an index; returns the index JSON text it wrote.
void write_sharded(const TempDir& dir) {
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {{"language_model.model.embed_tokens.weight", f32({1, 2}, {1, 2})},
                     {"language_model.model.layers.0.input_layernorm.weight", f32({3, 4}, {2})}});
  write_safetensors(dir / "model-00002-of-00002.safetensors",
                    {{"language_model.model.norm.weight", f32({5, 6}, {2})},
                     {"language_model.lm_head.weight", f32({7, 8}, {1, 2})}});
  write_file(dir / "model.safetensors.index.json", R"({
    "metadata": {"total_size": 32},
    "weight_map": {
      "language_model.model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "language_model.model.layers.0.input_layernorm.weight": "model-00001-of-00002.safetensors",
      "language_model.model.norm.weight": "model-00002-of-00002.safetensors",
      "language_model.lm_head.weight": "model-00002-of-00002.safetensors"
    }})");
}

TEST(Checkpoint, ShardedWithIndex) {
  TempDir dir;
  write_sharded(dir);
  // A stray file that is not part of the checkpoint is not read.
  write_safetensors(dir / "reference.safetensors", {{"logits", f32({1}, {1})}});
  Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"embed_tokens.weight", "layers.0.input_layernorm.weight",
                                                    "lm_head.weight", "norm.weight"}));
  EXPECT_EQ(ckpt.get("lm_head.weight").to_f32(), (std::vector<float>{7, 8}));
  EXPECT_EQ(ckpt.get("layers.0.input_layernorm.weight").to_f32(), (std::vector<float>{3, 4}));
  EXPECT_EQ(ckpt.source_of("lm_head.weight"), "model-00002-of-00002.safetensors: language_model.lm_head.weight");
  EXPECT_EQ(ckpt.files().size(), 2u);
}

TEST(Checkpoint, IndexIsAuthoritativeForTensorsItDoesNotList) {
  TempDir dir;
  write_safetensors(dir / "a.safetensors", {{"model.norm.weight", f32({1}, {1})}, {"model.stale", f32({2}, {1})}});
  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"model.norm.weight": "a.safetensors"}})");
  Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"norm.weight"}));
}

TEST(Checkpoint, BadIndexFiles) {
  TempDir dir;
  write_safetensors(dir / "a.safetensors", {{"model.norm.weight", f32({1}, {1})}});
  const auto index = dir / "model.safetensors.index.json";
  auto open = [&] { Checkpoint::open(dir.path()); };

  write_file(index, R"({"weight_map": {"model.norm.weight": "a.safetensors",)");
  expect_error(open, {"model.safetensors.index.json", "not valid JSON"});
  write_file(index, R"([1])");
  expect_error(open, {"model.safetensors.index.json", "JSON object"});
  write_file(index, R"({"metadata": {}})");
  expect_error(open, {"model.safetensors.index.json", "missing field 'weight_map'"});
  write_file(index, R"({"weight_map": ["a.safetensors"]})");
  expect_error(open, {"model.safetensors.index.json", "'weight_map' must be an object"});
  write_file(index, R"({"weight_map": {}})");
  expect_error(open, {"model.safetensors.index.json", "empty"});
  write_file(index, R"({"weight_map": {"model.norm.weight": 3}})");
  expect_error(open, {"model.safetensors.index.json", "'model.norm.weight'", "string"});
  write_file(index, R"({"weight_map": {"model.norm.weight": "b.safetensors"}})");
  expect_error(open, {"model.safetensors.index.json", "shard 'b.safetensors'", "model.norm.weight", "does not exist"});
  write_file(index, R"({"weight_map": {"model.norm.weight": "a.safetensors", "model.embed_tokens.weight": "a.safetensors"}})");
  expect_error(open, {"model.safetensors.index.json", "'model.embed_tokens.weight'", "'a.safetensors'", "does not contain it"});
  for (const char* escape : {"../a.safetensors", "/etc/passwd", "sub/a.safetensors", ".."}) {
    write_file(index, std::string(R"({"weight_map": {"model.norm.weight": ")") + escape + "\"}}");
    expect_error(open, {"model.safetensors.index.json", "not a plain file name"});
  }
}

TEST(Checkpoint, FallsBackToEveryLooseSafetensorsFile) {
  TempDir dir;
  write_safetensors(dir / "part-b.safetensors", {{"model.norm.weight", f32({1}, {1})}});
  write_safetensors(dir / "part-a.safetensors", {{"model.embed_tokens.weight", f32({2}, {1, 1})}});
  Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"embed_tokens.weight", "norm.weight"}));
  ASSERT_EQ(ckpt.files().size(), 2u);
  EXPECT_EQ(ckpt.files()[0]->path().filename(), "part-a.safetensors");  // sorted by name
}

TEST(Checkpoint, SeparateMtpFileIsLoadedToo) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"model.language_model.norm.weight", f32({1}, {1})}});
  write_safetensors(dir / "mtp.safetensors", {{"mtp.fc.weight", f32({2}, {1, 1})}});
  Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names(), (std::vector<std::string>{"mtp.fc.weight", "norm.weight"}));
  EXPECT_EQ(ckpt.source_of("mtp.fc.weight"), "mtp.safetensors: mtp.fc.weight");
}

TEST(Checkpoint, TwoSourcesOfOneCanonicalNameIsAnError) {
  TempDir dir;
  write_safetensors(dir / "x.safetensors", {{"model.norm.weight", f32({1}, {1})}});
  write_safetensors(dir / "y.safetensors", {{"model.language_model.norm.weight", f32({1}, {1})}});
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"'model.norm.weight' (x.safetensors)", "'model.language_model.norm.weight' (y.safetensors)",
                "'norm.weight'"});
}

TEST(Checkpoint, OpensASingleFilePath) {
  TempDir dir;
  write_safetensors(dir / "only.safetensors", {{"model.norm.weight", f32({1}, {1})}});
  Checkpoint ckpt = Checkpoint::open(dir / "only.safetensors");
  EXPECT_EQ(ckpt.dir(), dir.path());
  EXPECT_EQ(ckpt.names(), std::vector<std::string>{"norm.weight"});
}

TEST(Checkpoint, ManyTensorsPerFile) {
  // A 122B FP8 release has ~37k tensors; one file with 40k must open in well under a second
  // (no quadratic step in header parsing, ordering or name lookup).
  TempDir dir;
  std::vector<SafetensorsWriter::Declaration> decl;
  for (int i = 0; i < 40000; ++i)
    decl.push_back({"model.layers." + std::to_string(i % 48) + ".mlp.experts." + std::to_string(i) + ".w",
                    {DType::BF16, {2}}});
  {
    SafetensorsWriter w(dir / "model.safetensors", decl);
    for (int i = 0; i < 40000; ++i) {
      const uint16_t v[2] = {uint16_t(i), uint16_t(i >> 16)};
      w.write_tensor(decl[size_t(i)].first, v, sizeof(v));
    }
    w.finish();
  }
  Checkpoint ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt.names().size(), 40000u);
  EXPECT_EQ(ckpt.get("layers.5.mlp.experts.39989.w").data<uint16_t>()[0], uint16_t(39989));
  EXPECT_EQ(ckpt.names_with_prefix("layers.47.").size(), 833u);  // i % 48 == 47 for i < 40000
  EXPECT_EQ(ckpt.files()[0]->tensors()[12345].name, "model.layers.9.mlp.experts.12345.w");  // header order
}

TEST(Checkpoint, NotACheckpointDirectory) {
  TempDir dir;
  expect_error([&] { Checkpoint::open(dir / "absent"); }, {"absent", "not a directory"});
  expect_error([&] { Checkpoint::open(dir.path()); }, {dir.path().string(), "no model.safetensors"});
  write_file(dir / "model.safetensors", "garbage!");
  expect_error([&] { Checkpoint::open(dir.path()); }, {"model.safetensors", "exceeds the limit"});
}

}  // namespace
}  // namespace moeserve::io
