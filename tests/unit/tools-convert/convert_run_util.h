// Running `convert` in tests, and writing modified copies of fixture checkpoints.
#pragma once
#include <functional>
#include <string>

#include "convert_test_util.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "tools/convert.h"

namespace moeserve::tools::testing {

inline ConvertOptions convert_options(const fs::path& src, const fs::path& dst, const std::string& weights = "keep") {
  ConvertOptions o;
  o.src = src;
  o.dst = dst;
  o.weights = weights;
  o.threads = 2;
  o.progress = ProgressBar::Mode::Off;
  return o;
}

// The message of the moeserve::Error `f` throws ("(no error)" when it does not throw).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Writes `tensors` (stored names) as one model.safetensors plus `config` into `dir`.
inline void write_checkpoint(const fs::path& dir, const std::map<std::string, StoredTensor>& tensors,
                             const nlohmann::json& config) {
  fs::create_directories(dir);
  std::vector<io::SafetensorsWriter::Declaration> decl;
  for (const auto& [name, t] : tensors) decl.push_back({name, {t.dtype, t.shape}});
  io::SafetensorsWriter writer(dir / "model.safetensors", decl, {{"format", "pt"}});
  for (const auto& [name, t] : tensors) writer.write_tensor(name, t.bytes.data(), t.bytes.size());
  writer.finish();
  std::ofstream(dir / "config.json") << config.dump(2);
}

// The tensors of every shard file of `dir` as written (file name -> its tensors' bytes).
inline std::map<std::string, uint64_t> shard_tensor_bytes(const fs::path& dir) {
  std::map<std::string, uint64_t> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") {
      auto f = io::SafetensorsFile::open(e.path());
      uint64_t bytes = 0;
      for (const io::TensorInfo& t : f->tensors()) bytes += t.data_end - t.data_begin;
      out[e.path().filename().string()] = bytes;
    }
  return out;
}

// Entries of `dir`'s parent that look like convert staging directories of `dir`.
inline std::vector<std::string> staging_leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  const std::string stem = "." + dir.filename().string() + ".convert-";
  for (const auto& e : fs::directory_iterator(dir.parent_path()))
    if (e.path().filename().string().rfind(stem, 0) == 0) out.push_back(e.path().string());
  return out;
}

}  // namespace moeserve::tools::testing
