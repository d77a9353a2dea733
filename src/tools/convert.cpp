// `moeserve convert` (convert.h): reads the sources, plans, writes into a staging directory,
// renames it into place.
#include "tools/convert.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "tools/convert_config.h"
#include "tools/convert_output_dir.h"
#include "tools/convert_plan.h"
#include "tools/convert_shards.h"
#include "tools/convert_source.h"
#include "tools/convert_writer.h"

namespace moeserve::tools {

namespace fs = std::filesystem;

namespace {

void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) fail("cannot write {}", path.string());
}

// The number of MTP layers a donor's tensors hold: its config's value, else one past the
// largest "mtp.layers.N".
int64_t donor_mtp_layers(const SourceCheckpoint& donor) {
  if (donor.config) {
    const int64_t n = mtp_num_hidden_layers(*donor.config);
    if (n > 0) return n;
  }
  int64_t layers = 1;
  for (const SourceTensor& t : donor.tensors) {
    if (t.canonical.rfind("mtp.layers.", 0) != 0) continue;
    int64_t index = -1;
    std::from_chars(t.canonical.data() + 11, t.canonical.data() + t.canonical.size(), index);
    layers = std::max(layers, index + 1);
  }
  return layers;
}

void check_options(const ConvertOptions& o, WeightsMode mode, bool donors) {
  if (donors) {
    MOESERVE_CHECK(!o.hybrid_experts_from.empty() && !o.hybrid_dense_from.empty(),
                   "--hybrid-experts-from and --hybrid-dense-from go together (routed experts from one, everything "
                   "else from the other)");
    MOESERVE_CHECK(o.src.empty(), "with --hybrid-experts-from/--hybrid-dense-from give only DST: the donors are the "
                                  "sources (got the extra path '{}')",
                   o.src.string());
    MOESERVE_CHECK(mode == WeightsMode::Keep,
                   "--weights {} cannot be combined with hybrid donors: the donors are already quantised",
                   weights_mode_name(mode));
  } else {
    MOESERVE_CHECK(!o.src.empty(), "no source checkpoint given (moeserve convert SRC DST)");
  }
  MOESERVE_CHECK(!o.dst.empty(), "no output directory given (moeserve convert SRC DST)");
}

// The rewritten config.json text, or nullopt to copy the source's unchanged.
std::optional<std::string> output_config(const SourceCheckpoint& source, const ConvertOptions& o, WeightsMode mode,
                                         const ConvertPlan& plan, const SourceCheckpoint* experts_donor,
                                         const SourceCheckpoint* dense_donor, const SourceCheckpoint* mtp_donor) {
  if (!source.config) return std::nullopt;
  nlohmann::ordered_json config = *source.config;
  bool changed = false;
  if (mode == WeightsMode::GptqInt4 || mode == WeightsMode::HybridInt4Fp8) {
    set_quantization_config(config, int4_quantization_config(plan, o.group_size));
    changed = true;
  } else if (mode == WeightsMode::Fp8Block) {
    set_quantization_config(config, fp8_quantization_config(plan));
    changed = true;
  }
  if (experts_donor && dense_donor) {
    if (!experts_donor->config)
      fail("hybrid donors: {} does not exist", experts_donor->config_path().string());
    set_quantization_config(config, merged_hybrid_quantization_config(
                                        *experts_donor->config, experts_donor->config_path().string(),
                                        dominant_prefix(experts_donor->tensors), dominant_prefix(dense_donor->tensors),
                                        plan));
    changed = true;
  }
  if (mtp_donor) changed |= set_mtp_layers_if_missing(config, donor_mtp_layers(*mtp_donor));
  if (!changed) return std::nullopt;
  return config.dump(2) + "\n";
}

std::string gigabytes(uint64_t bytes) { return fmt::format("{:.3f} GB", double(bytes) / 1e9); }

}  // namespace

ConvertSummary run_convert(const ConvertOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const WeightsMode mode = parse_weights_mode(o.weights);
  const bool donors = !o.hybrid_experts_from.empty() || !o.hybrid_dense_from.empty();
  check_options(o, mode, donors);
  uint64_t max_shard_bytes = 0;
  try {
    max_shard_bytes = parse_size(o.max_shard_size);
  } catch (const Error& e) {
    fail("--max-shard-size: {}", e.what());
  }

  std::vector<fs::path> inputs;
  if (donors)
    inputs = {o.hybrid_experts_from, o.hybrid_dense_from};
  else
    inputs = {o.src};
  if (!o.add_mtp_from.empty()) inputs.push_back(o.add_mtp_from);
  // Checks DST first, before a possibly long scan of the sources.
  StagingDir staging(o.dst, o.force, inputs);

  std::optional<SourceCheckpoint> experts_donor, dense_donor, mtp_donor;
  SourceCheckpoint source;
  if (donors) {
    experts_donor = open_source_checkpoint(o.hybrid_experts_from);
    dense_donor = open_source_checkpoint(o.hybrid_dense_from);
    source = assemble_hybrid_donors(*experts_donor, *dense_donor);
  } else {
    source = open_source_checkpoint(o.src);
  }
  if (!o.add_mtp_from.empty()) {
    mtp_donor = open_source_checkpoint(o.add_mtp_from);
    source = assemble_mtp_donor(std::move(source), *mtp_donor);
  }
  if (mode != WeightsMode::Keep) {
    const io::Qwen35Config config = source.qwen35_config();
    if (config.quantization)
      fail("{} is already quantised (quantization_config.quant_method '{}'); --weights {} converts BF16/F16/F32 "
           "checkpoints",
           source.dir.string(), config.quantization->quant_method, weights_mode_name(mode));
  }

  const ConvertPlan plan = plan_conversion(source.tensors, PlanOptions{mode, o.modules, o.group_size});
  if (mode != WeightsMode::Keep && plan.int4_modules.empty() && plan.fp8_modules.empty())
    fail("--weights {}: {} has no BF16/F16/F32 Linear module of the kinds it quantises", weights_mode_name(mode),
         source.dir.string());
  const std::vector<Shard> shards = assign_shards(plan, max_shard_bytes);
  log::info("convert: {} INT4 modules (group {}), {} FP8 modules, {} kept; {} fused expert tensors split; "
            "{} -> {} in {} file(s)",
            plan.int4_modules.size(), o.group_size, plan.fp8_modules.size(), plan.dense_modules.size(),
            plan.fused_tensors_split, gigabytes(plan.source_bytes), gigabytes(plan.output_bytes), shards.size());

  // Non-weight files first (small), then config.json, then the weights.
  copy_non_weight_files(source.dir, staging.path(), {"config.json"});
  const std::optional<std::string> config_text =
      output_config(source, o, mode, plan, experts_donor ? &*experts_donor : nullptr,
                    dense_donor ? &*dense_donor : nullptr, mtp_donor ? &*mtp_donor : nullptr);
  if (config_text)
    write_text_file(staging.path() / "config.json", *config_text);
  else if (source.config)
    fs::copy_file(source.config_path(), staging.path() / "config.json");

  ThreadPool pool(o.threads);
  const int64_t total_mb = int64_t(std::ceil(double(plan.source_bytes) / 1e6));
  ProgressBar bar("convert", total_mb, stderr, o.progress, "MB");
  int64_t shown_mb = 0;
  WriteOptions write;
  write.group_size = o.group_size;
  write.pool = &pool;
  write.on_progress = [&](uint64_t processed) {
    const int64_t mb = processed >= plan.source_bytes ? total_mb : int64_t(double(processed) / 1e6);
    if (mb > shown_mb) bar.advance(mb - shown_mb), shown_mb = mb;
  };
  write_shards(plan, shards, staging.path(), write);
  bar.finish();
  if (shards.size() > 1)
    write_text_file(staging.path() / "model.safetensors.index.json", shard_index_json(plan, shards).dump(2) + "\n");
  staging.commit();

  ConvertSummary s;
  s.int4_modules = int64_t(plan.int4_modules.size());
  s.fp8_modules = int64_t(plan.fp8_modules.size());
  s.dense_modules = int64_t(plan.dense_modules.size());
  s.fused_tensors_split = plan.fused_tensors_split;
  for (const PlanItem& item : plan.items) s.tensors_written += int64_t(item.outputs.size());
  s.shards = int64_t(shards.size());
  s.source_bytes = plan.source_bytes;
  s.output_bytes = plan.output_bytes;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::info("convert: wrote {} ({} tensors, {} file(s), {}) in {:.1f} s", staging.target().string(), s.tensors_written,
            s.shards, gigabytes(s.output_bytes), s.seconds);
  return s;
}

}  // namespace moeserve::tools
