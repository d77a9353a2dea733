// The config.json a converted checkpoint carries: the source's, with the quantization_config of
// what was written (../shared/spec/qwen35_arch.md 4; the shapes follow the published releases
// and tests/fixtures/make_qwen35_fixtures.py), and mtp_num_hidden_layers set when an MTP block
// was added.
//
//   gptq-int4 and hybrid-int4-fp8 (AutoRound INT4 + FP8 detected from the tensors, as the
//   published hybrid carries it):
//     {"quant_method": "auto-round", "packing_format": "auto_round:auto_gptq", "bits": 4,
//      "group_size": g, "sym": true, "data_type": "int", "iters": 0 (RTN, AutoRound's meaning),
//      "block_name_to_quantize": "model.layers[,mtp.layers]",
//      "extra_config": {"<stored name of every Linear module left BF16>": {"bits": 16, "data_type": "fp"}}}
//   fp8-block:
//     {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
//      "weight_block_size": [128, 128], "modules_to_not_convert": [stored names of the Linear
//      modules left BF16 (lm_head included)]}
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/convert_plan.h"

namespace moeserve::tools {

nlohmann::ordered_json int4_quantization_config(const ConvertPlan& plan, int64_t group_size);
nlohmann::ordered_json fp8_quantization_config(const ConvertPlan& plan);

// For a hybrid assembled from donors: the experts donor's INT4 quantization_config with its
// extra_config rebuilt for the output: the donor's entries about routed experts are kept
// (renamed from `experts_prefix` to `output_prefix`), every other entry is dropped (those modules
// now come from the dense donor), and each BF16 Linear module of the output gets a bits-16 entry.
// Throws unless the donor's quant_method is auto-round or gptq.
nlohmann::ordered_json merged_hybrid_quantization_config(const nlohmann::ordered_json& experts_config,
                                                         const std::string& experts_source,
                                                         const std::string& experts_prefix,
                                                         const std::string& output_prefix, const ConvertPlan& plan);

// Sets config["quantization_config"] (top level, also for composite configs, as transformers
// writes it).
void set_quantization_config(nlohmann::ordered_json& config, nlohmann::ordered_json quantization_config);

// The text config's mtp_num_hidden_layers ("text_config" of a composite config, else the top
// level); 0 when absent.
int64_t mtp_num_hidden_layers(const nlohmann::ordered_json& config);
// Sets it to `layers` when absent or 0; returns whether it changed anything.
bool set_mtp_layers_if_missing(nlohmann::ordered_json& config, int64_t layers);

}  // namespace moeserve::tools
