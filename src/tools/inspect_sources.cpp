// Where an inspect report's tensors come from: a checkpoint as stored, a checkpoint as
// `moeserve convert --weights FORMAT` would write it, or config.json alone (the official BF16
// layout, optionally converted). The plans are convert's own (tools/convert_plan.h), so what
// inspect predicts is what convert writes.
#include <fmt/format.h>

#include "core/error.h"
#include "tools/convert_plan.h"
#include "tools/convert_source.h"
#include "tools/inspect.h"

namespace moeserve::tools {

namespace {

bool plans_conversion(const InspectPlan& plan) { return !plan.weights.empty() && plan.weights != "keep"; }

// The canonical tensors `convert` would write from `tensors`.
TensorCatalog planned_catalog(const std::vector<SourceTensor>& tensors, const InspectPlan& plan) {
  const WeightsMode mode = plan.weights.empty() ? WeightsMode::Keep : parse_weights_mode(plan.weights);
  const ConvertPlan cp = plan_conversion(tensors, PlanOptions{mode, std::nullopt, plan.group_size});
  TensorCatalog catalog;
  for (const PlanItem& item : cp.items)
    for (const OutputTensor& o : item.outputs)
      if (auto canonical = io::canonical_tensor_name(o.name)) catalog[*canonical] = {o.dtype, o.shape};
  return catalog;
}

std::string plan_description(const InspectPlan& plan) {
  const WeightsMode mode = parse_weights_mode(plan.weights);
  if (mode == WeightsMode::GptqInt4 || mode == WeightsMode::HybridInt4Fp8)
    return fmt::format("{} (INT4 group {})", weights_mode_name(mode), plan.group_size);
  return std::string(weights_mode_name(mode));
}

}  // namespace

InspectReport inspect_checkpoint(const std::filesystem::path& model_dir, const InspectPlan& plan) {
  const io::Checkpoint ckpt = io::Checkpoint::open(model_dir);
  std::optional<io::Qwen35Config> config;
  std::string config_error;
  try {
    config = io::load_qwen35_config(model_dir);
  } catch (const Error& e) {
    config_error = e.what();
  }
  TensorCatalog catalog;
  if (plans_conversion(plan)) {
    // As convert: a conversion starts from an unquantised checkpoint.
    if (config && config->quantization)
      fail("{} is already quantised (quantization_config.quant_method '{}'); --weights {} plans the conversion of "
           "a BF16/F16/F32 checkpoint",
           model_dir.string(), config->quantization->quant_method, plan.weights);
    catalog = planned_catalog(open_source_checkpoint(model_dir).tensors, plan);
  } else {
    for (const std::string& name : ckpt.names()) {
      const io::TensorInfo& info = ckpt.info(name);
      catalog[name] = {info.dtype, info.shape};
    }
  }
  InspectReport report = inspect_catalog(catalog, std::move(config), std::move(config_error), plan.int8_lm_head);
  report.model_dir = model_dir;
  if (plans_conversion(plan))
    report.planned = fmt::format("{} conversion of this checkpoint (moeserve convert --weights {})",
                                 plan_description(plan), plan.weights);
  for (const auto& file : ckpt.files()) {
    report.files.push_back(file->path().filename().string());
    report.file_bytes += file->file_size();
  }
  return report;
}

InspectReport inspect_config(const std::filesystem::path& config_path, const InspectPlan& plan) {
  const io::Qwen35Config config = io::load_qwen35_config(config_path);
  const TensorCatalog catalog = planned_catalog(reference_bf16_tensors(config), plan);
  InspectReport report = inspect_catalog(catalog, config, "", plan.int8_lm_head);
  report.model_dir = config_path;
  report.planned = plans_conversion(plan)
                       ? fmt::format("{} conversion of the official BF16 layout of this config", plan_description(plan))
                       : "the official BF16 layout of this config (no weights read)";
  return report;
}

}  // namespace moeserve::tools
