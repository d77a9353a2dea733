#include "io/checkpoint.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_text.h"
#include "core/log.h"

namespace moeserve::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
// Some FP8 releases ship the MTP head as a separate file that the index may not list
// (../shared/spec/qwen35_arch.md 4.2); it is loaded alongside the main weights.
constexpr const char* kMtpFile = "mtp.safetensors";

// Every *.safetensors file directly in dir, sorted by name.
std::vector<fs::path> list_safetensors(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors" && entry.is_regular_file(ec))
      files.push_back(entry.path());
  }
  if (ec) fail("checkpoint {}: cannot list the directory: {}", dir.string(), ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

// A shard name from an index must be a plain file name in the model directory: no path
// separators, no "..", nothing absolute (an index must not point outside the directory).
void check_shard_name(const std::string& shard, const fs::path& index_path, const std::string& tensor) {
  if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
      shard.find('\\') != std::string::npos || shard.find('\0') != std::string::npos)
    fail("{}: weight_map entry '{}' names the shard '{}', which is not a plain file name in the "
         "model directory",
         index_path.string(), tensor, shard);
}

// Parses model.safetensors.index.json: tensor name -> shard file name, in sorted order.
std::map<std::string, std::string> read_index(const fs::path& index_path) {
  const std::string text = read_file_text(index_path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", index_path.string(), e.what());
  }
  if (!j.is_object()) fail("{}: must be a JSON object", index_path.string());
  auto wm = j.find("weight_map");
  if (wm == j.end()) fail("{}: missing field 'weight_map'", index_path.string());
  if (!wm->is_object())
    fail("{}: 'weight_map' must be an object of tensor name -> shard file, found {}",
         index_path.string(), wm->type_name());
  std::map<std::string, std::string> map;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string())
      fail("{}: weight_map entry '{}' must be a file name string, found {}", index_path.string(),
           tensor, shard.type_name());
    check_shard_name(shard.get<std::string>(), index_path, tensor);
    map.emplace(tensor, shard.get<std::string>());
  }
  if (map.empty()) fail("{}: 'weight_map' is empty", index_path.string());
  return map;
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& model_dir) {
  Checkpoint ckpt;
  std::error_code ec;
  // A single .safetensors file is accepted too (its directory is the model directory).
  const bool single_file = fs::is_regular_file(model_dir, ec) && model_dir.extension() == ".safetensors";
  if (!single_file && !fs::is_directory(model_dir, ec))
    fail("checkpoint {}: not a directory", model_dir.string());
  ckpt.dir_ = single_file ? model_dir.parent_path() : model_dir;

  // Which files, and for sharded checkpoints which tensors each one must provide.
  std::vector<fs::path> files;
  std::map<std::string, std::string> index;  // source name -> shard (sharded checkpoints only)
  fs::path index_path = ckpt.dir_ / kIndexFile;
  if (single_file) {
    files.push_back(model_dir);
  } else if (fs::is_regular_file(ckpt.dir_ / kSingleFile, ec)) {
    files.push_back(ckpt.dir_ / kSingleFile);
  } else if (fs::exists(index_path, ec)) {
    index = read_index(index_path);
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : index) shards.insert(shard);
    for (const std::string& shard : shards) {
      if (!fs::is_regular_file(ckpt.dir_ / shard, ec))
        fail("{}: shard '{}' (holding e.g. '{}') does not exist", index_path.string(), shard,
             std::find_if(index.begin(), index.end(), [&](auto& kv) { return kv.second == shard; })->first);
      files.push_back(ckpt.dir_ / shard);
    }
  }
  if (!files.empty() && !single_file && fs::is_regular_file(ckpt.dir_ / kMtpFile, ec) &&
      std::find(files.begin(), files.end(), ckpt.dir_ / kMtpFile) == files.end())
    files.push_back(ckpt.dir_ / kMtpFile);
  if (files.empty()) {
    files = list_safetensors(ckpt.dir_);
    if (files.empty())
      fail("checkpoint {}: no {}, no {} and no *.safetensors files", ckpt.dir_.string(), kSingleFile,
           kIndexFile);
  }

  std::map<std::string, std::string> source_name_of;  // canonical -> source name (for messages)
  for (const fs::path& path : files) {
    auto file = SafetensorsFile::open(path);
    const std::string shard = path.filename().string();
    size_t unlisted = 0;
    for (const TensorInfo& info : file->tensors()) {
      if (!index.empty() && shard != kMtpFile) {
        auto it = index.find(info.name);
        // The index is authoritative: a tensor it assigns to another shard (or not at all)
        // is a stale copy and is not loaded.
        if (it == index.end() || it->second != shard) {
          ++unlisted;
          continue;
        }
      }
      std::optional<std::string> canonical = canonical_tensor_name(info.name);
      if (!canonical) continue;
      auto [pos, inserted] = ckpt.entries_.emplace(*canonical, Entry{file.get(), &info});
      if (!inserted)
        fail("checkpoint {}: '{}' ({}) and '{}' ({}) are both the tensor '{}'", ckpt.dir_.string(),
             source_name_of[*canonical], pos->second.file->path().filename().string(), info.name,
             shard, *canonical);
      source_name_of[*canonical] = info.name;
    }
    if (unlisted > 0)
      log::warn("{}: {} tensors not assigned to this shard by {} were ignored", path.string(),
                unlisted, kIndexFile);
    ckpt.files_.push_back(std::move(file));
  }

  // Every tensor the index lists must be in its shard.
  std::map<std::string, const SafetensorsFile*> by_shard;
  for (const auto& f : ckpt.files_) by_shard[f->path().filename().string()] = f.get();
  for (const auto& [tensor, shard] : index) {
    const SafetensorsFile* file = by_shard[shard];
    if (!file || !file->find(tensor))
      fail("{}: tensor '{}' is listed in shard '{}', but that file does not contain it",
           index_path.string(), tensor, shard);
  }
  log::debug("checkpoint {}: {} files, {} tensors", ckpt.dir_.string(), ckpt.files_.size(),
             ckpt.entries_.size());
  return ckpt;
}

const Checkpoint::Entry& Checkpoint::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("checkpoint {}: missing tensor {}", dir_.string(), name);
  return it->second;
}

bool Checkpoint::has(const std::string& name) const { return entries_.count(name) != 0; }

const TensorInfo& Checkpoint::info(const std::string& name) const { return *entry(name).info; }

Tensor Checkpoint::get(const std::string& name) const {
  const Entry& e = entry(name);
  return e.file->tensor(e.info->name);
}

Tensor Checkpoint::get(const std::string& name, DType dtype, const Shape& shape) const {
  const Entry& e = entry(name);
  if (e.info->dtype != dtype || e.info->shape != shape)
    fail("checkpoint {}: tensor {} ({}): expected {} {}, got {} {}", dir_.string(), name,
         source_of(name), dtype_name(dtype), shape_to_string(shape), dtype_name(e.info->dtype),
         shape_to_string(e.info->shape));
  return e.file->tensor(e.info->name);
}

Tensor Checkpoint::get_float(const std::string& name, const Shape& shape) const {
  const Entry& e = entry(name);
  const DType t = e.info->dtype;
  if ((t != DType::BF16 && t != DType::F16 && t != DType::F32) || e.info->shape != shape)
    fail("checkpoint {}: tensor {} ({}): expected a BF16/F16/F32 tensor of shape {}, got {} {}",
         dir_.string(), name, source_of(name), shape_to_string(shape), dtype_name(t),
         shape_to_string(e.info->shape));
  return e.file->tensor(e.info->name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

std::string Checkpoint::source_of(const std::string& name) const {
  const Entry& e = entry(name);
  return e.file->path().filename().string() + ": " + e.info->name;
}

std::vector<std::string> Checkpoint::names_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = entries_.lower_bound(prefix);
       it != entries_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.push_back(it->first);
  return out;
}

}  // namespace moeserve::io
