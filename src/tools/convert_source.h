// The tensors `moeserve convert` reads: every tensor of a checkpoint directory under its stored
// name (vision tower included: convert copies what it does not change), and the assembly of
// one source from several checkpoints (hybrid donors, an MTP donor).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/qwen35_config.h"
#include "io/safetensors.h"

namespace moeserve::tools {

struct SourceTensor {
  std::string name;       // as stored in its file
  std::string canonical;  // io::canonical_tensor_name; empty for tensors outside the text model
  Tensor view;            // dtype and shape; the bytes are a view into the mapped file, or
                          // undefined when planning without data (inspect --config-only)
  std::string origin;     // "DIR/file.safetensors", for messages

  DType dtype() const { return view.dtype(); }
  const Shape& shape() const { return view.shape(); }
  uint64_t nbytes() const { return view.nbytes(); }
  // The stored-name prefix of the text model this tensor carries ("model.language_model." for
  // "model.language_model.layers.0.x" whose canonical name is "layers.0.x"); empty when none.
  std::string prefix() const;
};

// A checkpoint directory: its config.json (if any) and its tensors in file order (shards in
// the order io::Checkpoint opens them, each in header order). The file selection is
// io::Checkpoint's: model.safetensors, else the index's shards (only the tensors the index
// assigns to each), else every *.safetensors; plus mtp.safetensors.
struct SourceCheckpoint {
  std::filesystem::path dir;
  std::optional<nlohmann::ordered_json> config;  // config.json, parsed; nullopt when absent
  std::vector<SourceTensor> tensors;

  // The parsed text-model config; throws naming DIR/config.json when absent or invalid.
  io::Qwen35Config qwen35_config() const;
  std::filesystem::path config_path() const { return dir / "config.json"; }
};

// Opens and validates DIR (a moeserve::Error names the directory when it is not a checkpoint,
// e.g. no safetensors files, or config.json is not valid JSON).
SourceCheckpoint open_source_checkpoint(const std::filesystem::path& dir);

// True for the routed experts of the main model: canonical names "layers.N.mlp.experts.*"
// (the MTP block's experts are not included).
bool is_main_routed_expert(const std::string& canonical);

// The text-model prefix most tensors of `tensors` carry (e.g. "model."), for naming tensors
// moved in from another checkpoint. Empty when none has one.
std::string dominant_prefix(const std::vector<SourceTensor>& tensors);

// Hybrid from two donors (the seed's build-hybrid-checkpoint idea): the main model's routed
// experts from `experts` (an INT4 checkpoint), every other tensor (MTP included) from `dense`
// (an FP8 checkpoint). Expert tensors are renamed into the dense donor's prefix. Checks that
// both configs describe the same architecture and that every expert module of every layer is
// present in `experts` with the shape config.json gives (any stored format). The result's dir
// and config are the dense donor's.
SourceCheckpoint assemble_hybrid_donors(const SourceCheckpoint& experts, const SourceCheckpoint& dense);

// Replaces the mtp.* tensors of `base` with those of `donor` (appended at the end). Checks that
// the donor has MTP tensors and the same architecture where the MTP block depends on it.
SourceCheckpoint assemble_mtp_donor(SourceCheckpoint base, const SourceCheckpoint& donor);

// The tensors of an official BF16 release of `config`, planned from the config alone (views
// without data, names under "model."): spec 3.1 with fused experts, A_log and linear_attn.norm
// in F32, and the MTP block (3.3) when mtp_num_hidden_layers > 0. For `inspect --config-only`.
std::vector<SourceTensor> reference_bf16_tensors(const io::Qwen35Config& config);

}  // namespace moeserve::tools
