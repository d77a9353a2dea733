// A model directory's tensors under canonical names.
//
// Which files: model.safetensors if present; else model.safetensors.index.json (its
// "weight_map" names the shard of every tensor; it is authoritative: a listed tensor missing
// from its shard is an error, a shard's unlisted tensors are ignored); else every
// *.safetensors in the directory. A separate mtp.safetensors (some FP8 releases) is loaded
// in addition. open() also accepts the path of a single .safetensors file.
//
// Canonical names (what the model code asks for):
//   "model.language_model.X", "language_model.model.X", "model.X"  -> "X"
//       e.g. "model.language_model.layers.3.mlp.gate.weight" -> "layers.3.mlp.gate.weight",
//            "model.embed_tokens.weight" -> "embed_tokens.weight", "model.norm.weight" -> "norm.weight"
//   "lm_head.X", "language_model.lm_head.X"                          -> "lm_head.X"
//   "mtp.X"                                                          -> kept as is
//   "model.visual.X", "visual.X"                                     -> skipped (vision tower)
// Two source tensors mapping to the same canonical name is an error naming both.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace moeserve::io {

// The canonical name of a checkpoint tensor name; nullopt for tensors that are skipped
// (the vision tower).
std::optional<std::string> canonical_tensor_name(const std::string& source_name);

class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& model_dir);

  const std::filesystem::path& dir() const { return dir_; }
  bool has(const std::string& name) const;
  // Throws "checkpoint DIR: missing tensor NAME".
  Tensor get(const std::string& name) const;
  // Also checks dtype and shape; the message names file, tensor, expected and got.
  Tensor get(const std::string& name, DType dtype, const Shape& shape) const;
  // dtype must be BF16, F16 or F32; checks the shape.
  Tensor get_float(const std::string& name, const Shape& shape) const;
  // The header entry (dtype, shape, byte range) of a tensor; throws like get() when absent.
  const TensorInfo& info(const std::string& name) const;
  std::vector<std::string> names() const;  // canonical, sorted
  // "file.safetensors: original.name", for messages.
  std::string source_of(const std::string& name) const;
  // Canonical names starting with prefix, sorted.
  std::vector<std::string> names_with_prefix(const std::string& prefix) const;
  // The opened shard files, in the order they were opened.
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;  // points into file->tensors()
  };
  const Entry& entry(const std::string& name) const;

  std::filesystem::path dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> entries_;  // canonical name -> where it is
};

}  // namespace moeserve::io
