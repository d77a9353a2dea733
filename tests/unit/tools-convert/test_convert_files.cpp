// `moeserve convert` on the transformers fixtures, checked at the file level: bit-exact
// re-sharding, the tensors the INT4/FP8/hybrid conversions write (against the fixture script's
// own packing), hybrid from donors, --add-mtp-from, atomic output, --force, and every error.
#include <gtest/gtest.h>

#include <set>

#include "convert_run_util.h"

namespace moeserve::tools {
namespace {

using testing::error_of;
using testing::fixture;
using testing::read_all_tensors;
using testing::read_json;
using testing::read_text;
using testing::StoredTensor;
using testing::TempDir;
namespace fs = std::filesystem;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ConvertReshard, BitExactWithShardSizesRespectedAndACorrectIndex) {
  TempDir tmp("reshard");
  const fs::path src = fixture("composite_bf16_fused_sharded"), dst = tmp / "out";
  ConvertOptions o = testing::convert_options(src, dst);
  o.max_shard_size = "200KB";
  const ConvertSummary s = run_convert(o);

  const auto before = read_all_tensors(src), after = read_all_tensors(dst);
  EXPECT_EQ(before.size(), after.size());
  for (const auto& [name, t] : before) {
    ASSERT_TRUE(after.count(name)) << name;
    EXPECT_TRUE(after.at(name) == t) << name;
  }
  // Shards of at most 200 kB of tensor data (the largest tensor here is under that).
  const auto shards = testing::shard_tensor_bytes(dst);
  EXPECT_EQ(int64_t(shards.size()), s.shards);
  EXPECT_GE(shards.size(), 8u);
  uint64_t total = 0;
  for (const auto& [file, bytes] : shards) {
    EXPECT_LE(bytes, 200'000u) << file;
    EXPECT_TRUE(contains(file, fmt::format("-of-{:05d}.safetensors", shards.size()))) << file;
    total += bytes;
  }
  // The index lists every tensor, in the file that holds it, and the total.
  const nlohmann::json index = read_json(dst / "model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), after.size());
  for (const auto& [file, bytes] : shards) {
    auto f = io::SafetensorsFile::open(dst / file);
    for (const io::TensorInfo& t : f->tensors()) EXPECT_EQ(index["weight_map"][t.name], file) << t.name;
  }
  // Non-weight files come along unchanged; the fixture's reference.safetensors is not a weight
  // file of the model but is a *.safetensors, which convert never copies.
  EXPECT_EQ(read_text(dst / "config.json"), read_text(src / "config.json"));
  EXPECT_EQ(read_text(dst / "reference.json"), read_text(src / "reference.json"));
  EXPECT_FALSE(fs::exists(dst / "reference.safetensors"));
  EXPECT_TRUE(testing::staging_leftovers(dst).empty());
}

TEST(ConvertReshard, IntoOneFileWithoutAnIndex) {
  TempDir tmp("reshard1");
  const fs::path dst = tmp / "out";
  run_convert(testing::convert_options(fixture("hybrid_int4_fp8"), dst));
  EXPECT_TRUE(fs::exists(dst / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dst / "model.safetensors.index.json"));
  EXPECT_EQ(read_all_tensors(dst), read_all_tensors(fixture("hybrid_int4_fp8")));
}

// The fixture script quantised the same modules with the same RTN recipe (group 32), so the
// INT4 conversion of quant_base_bf16 is int4_autoround_sym, tensor for tensor.
TEST(ConvertQuantise, Int4OfTheBaseIsTheFixturesInt4Checkpoint) {
  TempDir tmp("int4");
  const fs::path dst = tmp / "out";
  ConvertOptions o = testing::convert_options(fixture("quant_base_bf16"), dst, "gptq-int4");
  o.group_size = 32;
  const ConvertSummary s = run_convert(o);
  EXPECT_EQ(s.int4_modules, 151);
  EXPECT_EQ(s.fp8_modules, 0);
  EXPECT_EQ(read_all_tensors(dst), read_all_tensors(fixture("int4_autoround_sym")));

  const nlohmann::json q = read_json(dst / "config.json")["quantization_config"];
  EXPECT_EQ(q["quant_method"], "auto-round");
  EXPECT_EQ(q["packing_format"], "auto_round:auto_gptq");
  EXPECT_EQ(q["group_size"], 32);
  EXPECT_EQ(q["block_name_to_quantize"], "model.layers");
  EXPECT_EQ(q["extra_config"].size(), 5u * 2 + 4 * 2);  // router + shared gate per layer, in_proj_a/b
  EXPECT_EQ(q["extra_config"]["model.layers.0.mlp.shared_expert_gate"]["bits"], 16);
  // Apart from quantization_config, config.json is the source's.
  nlohmann::json c = read_json(dst / "config.json"), base = read_json(fixture("quant_base_bf16") / "config.json");
  c.erase("quantization_config");
  EXPECT_EQ(c, base);
}

// Tensors outside the text model (the vision tower of a composite checkpoint) are copied as
// they are, never quantised, and keep their names.
TEST(ConvertQuantise, VisionTowerIsCopiedUnchanged) {
  TempDir tmp("vision");
  auto tensors = read_all_tensors(fixture("quant_base_bf16"));
  StoredTensor vision{DType::BF16, {64, 128}, std::vector<uint8_t>(64 * 128 * 2)};
  for (size_t i = 0; i < vision.bytes.size(); i += 2) vision.bytes[i + 1] = 0x3f;  // 0.5-ish values
  tensors["model.visual.blocks.0.attn.qkv.weight"] = vision;
  testing::write_checkpoint(tmp / "src", tensors, read_json(fixture("quant_base_bf16") / "config.json"));
  ConvertOptions o = testing::convert_options(tmp / "src", tmp / "out", "fp8-block");
  run_convert(o);
  const auto out = read_all_tensors(tmp / "out");
  EXPECT_TRUE(out.at("model.visual.blocks.0.attn.qkv.weight") == vision);
  EXPECT_FALSE(out.count("model.visual.blocks.0.attn.qkv.weight_scale_inv"));
  EXPECT_EQ(out.at("model.layers.3.self_attn.q_proj.weight").dtype, DType::F8_E4M3);
}

TEST(ConvertQuantise, Fp8AndHybridWriteTheFixturesTensorsWhereTheRecipesAgree) {
  TempDir tmp("fp8");
  const auto base = read_all_tensors(fixture("quant_base_bf16"));
  for (const std::string mode : {"fp8-block", "hybrid-int4-fp8"}) {
    const fs::path dst = tmp / mode;
    ConvertOptions o = testing::convert_options(fixture("quant_base_bf16"), dst, mode);
    o.group_size = 32;
    run_convert(o);
    const auto out = read_all_tensors(dst);
    const auto ref = read_all_tensors(fixture(mode == "fp8-block" ? "fp8_block" : "hybrid_int4_fp8"));
    // Same tensor names; dtypes differ only where the fixture stored BF16 scales.
    ASSERT_EQ(out.size(), ref.size()) << mode;
    int same = 0, bf16_scales = 0;
    for (const auto& [name, t] : ref) {
      ASSERT_TRUE(out.count(name)) << mode << " " << name;
      const StoredTensor& mine = out.at(name);
      const bool dense_fp8 = t.dtype == DType::BF16 && contains(name, ".weight_scale_inv");
      const bool dense_fp8_codes = !dense_fp8 && ref.count(name + "_scale_inv") &&
                                   ref.at(name + "_scale_inv").dtype == DType::BF16;
      if (dense_fp8) {
        // F32 here, BF16 there: the same block maxima / 448, rounded differently.
        ++bf16_scales;
        EXPECT_EQ(mine.dtype, DType::F32);
        EXPECT_EQ(mine.shape, t.shape);
        const auto a = testing::to_floats(mine), b = testing::to_floats(t);
        for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(f32_to_bf16(a[i]), f32_to_bf16(b[i])) << name;
      } else if (!dense_fp8_codes) {
        EXPECT_TRUE(mine == t) << mode << " " << name;
        ++same;
      }
    }
    EXPECT_EQ(bf16_scales, 4 * 3 + 4 + 5 * 3) << mode;  // GDN qkv/z/out, attention, shared expert
    // Experts (2 or 3 tensors each) plus the 49 tensors both keep BF16/F32.
    EXPECT_EQ(same, (mode == "fp8-block" ? 120 * 2 : 120 * 3) + 49) << mode;
    EXPECT_EQ(out.at("model.layers.0.mlp.gate.weight"), base.at("model.layers.0.mlp.gate.weight"));
  }
  const nlohmann::json fp8 = read_json(tmp / "fp8-block" / "config.json")["quantization_config"];
  EXPECT_EQ(fp8["quant_method"], "fp8");
  EXPECT_EQ(fp8["weight_block_size"], (nlohmann::json{128, 128}));
  const std::vector<std::string> not_converted = fp8["modules_to_not_convert"];
  EXPECT_EQ(std::set<std::string>(not_converted.begin(), not_converted.end()).count("lm_head"), 1u);
  EXPECT_EQ(read_json(tmp / "hybrid-int4-fp8" / "config.json")["quantization_config"]["quant_method"], "auto-round");
}

// The seed's recipe: routed experts from the INT4 checkpoint, everything else from the FP8 one.
// The fixture script built hybrid_int4_fp8 from the same two quantisations, so the result is that
// checkpoint, tensor for tensor.
TEST(ConvertDonors, HybridFromTwoDonorsIsTheFixtureHybrid) {
  TempDir tmp("donors");
  const fs::path dst = tmp / "out";
  ConvertOptions o = testing::convert_options("", dst);
  o.hybrid_experts_from = fixture("int4_autoround_sym");
  o.hybrid_dense_from = fixture("fp8_block");
  o.max_shard_size = "1MB";
  run_convert(o);
  EXPECT_EQ(read_all_tensors(dst), read_all_tensors(fixture("hybrid_int4_fp8")));
  const nlohmann::json index = read_json(dst / "model.safetensors.index.json");
  EXPECT_EQ(index["weight_map"].size(), read_all_tensors(dst).size());

  nlohmann::json config = read_json(dst / "config.json");
  const nlohmann::json q = config["quantization_config"];
  EXPECT_EQ(q["quant_method"], "auto-round");
  EXPECT_EQ(q["group_size"], 32);
  // extra_config names exactly the modules left BF16: the FP8 donor's shared_expert_gate entry
  // stays, attention / DeltaNet / shared-expert modules (now FP8) are not declared BF16.
  std::set<std::string> keys;
  for (const auto& [k, v] : q["extra_config"].items()) keys.insert(k);
  EXPECT_EQ(keys.size(), 5u * 2 + 4 * 2);
  EXPECT_TRUE(keys.count("model.layers.0.mlp.shared_expert_gate"));
  EXPECT_TRUE(keys.count("model.layers.1.linear_attn.in_proj_a"));
  EXPECT_FALSE(keys.count("model.layers.3.self_attn.q_proj"));
  config.erase("quantization_config");
  nlohmann::json dense_config = read_json(fixture("fp8_block") / "config.json");
  dense_config.erase("quantization_config");
  EXPECT_EQ(config, dense_config);
}

TEST(ConvertDonors, DonorsThatDisagreeAreRefused) {
  TempDir tmp("donors_bad");
  ConvertOptions o = testing::convert_options("", tmp / "out");
  o.hybrid_dense_from = fixture("fp8_block");

  o.hybrid_experts_from = fixture("text_f32_perexpert");
  EXPECT_TRUE(contains(error_of([&] { run_convert(o); }), "hybrid donors disagree: hidden_size is 80"));

  // One expert module with the wrong shape.
  auto tensors = read_all_tensors(fixture("int4_autoround_sym"));
  tensors["model.layers.2.mlp.experts.5.up_proj.qweight"] = StoredTensor{DType::I32, {8, 64}, std::vector<uint8_t>(2048)};
  testing::write_checkpoint(tmp / "bad_shape", tensors, read_json(fixture("int4_autoround_sym") / "config.json"));
  o.hybrid_experts_from = tmp / "bad_shape";
  const std::string shape = error_of([&] { run_convert(o); });
  EXPECT_TRUE(contains(shape, "routed expert 'layers.2.mlp.experts.5.up_proj'")) << shape;
  EXPECT_TRUE(contains(shape, "is [N, K] = [64, 64]")) << shape;

  // A missing expert module.
  tensors = read_all_tensors(fixture("int4_autoround_sym"));
  for (const char* role : {"qweight", "qzeros", "scales"})
    tensors.erase(std::string("model.layers.4.mlp.experts.7.down_proj.") + role);
  testing::write_checkpoint(tmp / "missing", tensors, read_json(fixture("int4_autoround_sym") / "config.json"));
  o.hybrid_experts_from = tmp / "missing";
  EXPECT_TRUE(contains(error_of([&] { run_convert(o); }), "no routed expert module 'layers.4.mlp.experts.7.down_proj'"));

  // An experts donor that is not INT4.
  o.hybrid_experts_from = fixture("quant_base_bf16");
  EXPECT_TRUE(contains(error_of([&] { run_convert(o); }), "the experts donor must be an INT4"));

  // Flags that do not go together.
  ConvertOptions half = testing::convert_options("", tmp / "out");
  half.hybrid_experts_from = fixture("int4_autoround_sym");
  EXPECT_TRUE(contains(error_of([&] { run_convert(half); }), "go together"));
  ConvertOptions extra = testing::convert_options(fixture("quant_base_bf16"), tmp / "out");
  extra.hybrid_experts_from = fixture("int4_autoround_sym");
  extra.hybrid_dense_from = fixture("fp8_block");
  EXPECT_TRUE(contains(error_of([&] { run_convert(extra); }), "give only DST"));
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(ConvertMtp, AddsTheMtpBlockOfAnotherCheckpoint) {
  TempDir tmp("mtp");
  // The composite fixture without its MTP block, as a single file with mtp_num_hidden_layers 0.
  const fs::path donor = fixture("composite_bf16_fused_sharded");
  auto all = read_all_tensors(donor);
  std::map<std::string, StoredTensor> base;
  for (const auto& [name, t] : all)
    if (name.rfind("mtp.", 0) != 0) base[name] = t;
  ASSERT_LT(base.size(), all.size());
  nlohmann::json config = read_json(donor / "config.json");
  config["text_config"]["mtp_num_hidden_layers"] = 0;
  testing::write_checkpoint(tmp / "base", base, config);

  ConvertOptions o = testing::convert_options(tmp / "base", tmp / "out");
  o.add_mtp_from = donor;
  run_convert(o);
  EXPECT_EQ(read_all_tensors(tmp / "out"), all);
  EXPECT_EQ(read_json(tmp / "out" / "config.json")["text_config"]["mtp_num_hidden_layers"], 1);

  // A donor of another architecture, and one without MTP weights.
  o.dst = tmp / "out2";
  o.add_mtp_from = fixture("text_f32_perexpert");
  EXPECT_TRUE(contains(error_of([&] { run_convert(o); }), "--add-mtp-from: the checkpoints disagree: hidden_size"));
  o.add_mtp_from = fixture("quant_base_bf16");
  EXPECT_TRUE(contains(error_of([&] { run_convert(o); }), "has no mtp.* tensors"));
  EXPECT_FALSE(fs::exists(tmp / "out2"));
}

// A non-finite weight in the last routed expert fails the conversion after most of it was
// written: nothing may appear at DST, no staging directory may be left, and with --force an
// existing DST must stay exactly as it was.
TEST(ConvertAtomic, AFailureMidwayLeavesNoTrace) {
  TempDir tmp("atomic");
  auto tensors = read_all_tensors(fixture("quant_base_bf16"));
  StoredTensor& w = tensors.at("model.layers.4.mlp.experts.7.down_proj.weight");
  const uint16_t inf = 0x7f80;
  std::memcpy(w.bytes.data() + 2 * 100, &inf, 2);
  testing::write_checkpoint(tmp / "src", tensors, read_json(fixture("quant_base_bf16") / "config.json"));

  const fs::path dst = tmp / "out";
  ConvertOptions o = testing::convert_options(tmp / "src", dst, "fp8-block");
  o.max_shard_size = "100KB";  // several shards are complete when the failure comes
  const std::string error = error_of([&] { run_convert(o); });
  EXPECT_TRUE(contains(error, "'layers.4.mlp.experts.7.down_proj': weight [1, 36] is inf")) << error;
  EXPECT_FALSE(fs::exists(dst));
  EXPECT_TRUE(testing::staging_leftovers(dst).empty());

  fs::create_directories(dst);
  std::ofstream(dst / "marker") << "old";
  o.force = true;
  EXPECT_TRUE(contains(error_of([&] { run_convert(o); }), "is inf"));
  EXPECT_EQ(read_text(dst / "marker"), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dst), fs::directory_iterator()), 1);
  EXPECT_TRUE(testing::staging_leftovers(dst).empty());
}

TEST(ConvertAtomic, ExistingDestinationNeedsForce) {
  TempDir tmp("force");
  const fs::path dst = tmp / "out";
  fs::create_directories(dst);
  std::ofstream(dst / "marker") << "old";
  ConvertOptions o = testing::convert_options(fixture("quant_base_bf16"), dst);
  EXPECT_TRUE(contains(error_of([&] { run_convert(o); }), "already exists (pass --force to replace it)"));
  EXPECT_TRUE(fs::exists(dst / "marker"));
  o.force = true;
  run_convert(o);
  EXPECT_FALSE(fs::exists(dst / "marker"));
  EXPECT_EQ(read_all_tensors(dst), read_all_tensors(fixture("quant_base_bf16")));
  EXPECT_TRUE(testing::staging_leftovers(dst).empty());

  // A stale staging directory of a process that no longer exists is cleaned up.
  const fs::path stale = tmp / ".out.convert-tmp-999999999";
  fs::create_directories(stale);
  run_convert(o);
  EXPECT_FALSE(fs::exists(stale));
}

TEST(ConvertErrors, ClearMessages) {
  TempDir tmp("errors");
  const fs::path base = fixture("quant_base_bf16"), dst = tmp / "out";
  auto error = [&](ConvertOptions o) { return error_of([&] { run_convert(o); }); };
  ConvertOptions o = testing::convert_options(base, dst, "int3");
  EXPECT_TRUE(contains(error(o), "unknown --weights 'int3' (expected keep, gptq-int4, fp8-block or hybrid-int4-fp8)"));

  o = testing::convert_options(base, dst, "gptq-int4");
  o.modules = "experts\\.99\\.";
  EXPECT_TRUE(contains(error(o), "--modules 'experts\\.99\\.' matches no Linear module"));
  o.modules.reset();
  o.group_size = 48;
  EXPECT_TRUE(contains(error(o), "module 'layers.0.linear_attn.in_proj_qkv': in_features K = 128 is not divisible by "
                                 "the group size 48"));
  o = testing::convert_options(base, dst);
  o.modules = "experts";
  EXPECT_TRUE(contains(error(o), "--modules applies to --weights gptq-int4 and fp8-block, not keep"));

  fs::create_directories(tmp / "empty");
  EXPECT_TRUE(contains(error(testing::convert_options(tmp / "empty", dst)), "no model.safetensors"));
  EXPECT_TRUE(contains(error(testing::convert_options(tmp / "nope", dst)), "is not a checkpoint directory"));
  EXPECT_TRUE(contains(error(testing::convert_options(fixture("int4_autoround_sym"), dst, "fp8-block")),
                       "is already quantised (quantization_config.quant_method 'auto-round')"));
  o = testing::convert_options(base, base);
  o.force = true;
  EXPECT_TRUE(contains(error(o), "is the input checkpoint"));
  o = testing::convert_options(base, dst);
  o.max_shard_size = "lots";
  EXPECT_TRUE(contains(error(o), "--max-shard-size: size 'lots' is not a number"));
  EXPECT_FALSE(fs::exists(dst));
  EXPECT_TRUE(testing::staging_leftovers(dst).empty());
}

}  // namespace
}  // namespace moeserve::tools
