// Writes edited copies of a fixture checkpoint (other expert layouts, missing or mis-shaped
// tensors) into a temporary directory, for loader and layout tests.
#pragma once
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "fixture_util.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace moeserve::model::testing {

using TensorList = std::vector<std::pair<std::string, Tensor>>;
// Receives each canonical tensor; appends what to write instead (nothing drops it).
using TensorEdit = std::function<void(const std::string& name, const Tensor& t, TensorList& out)>;

// A directory removed at the end of its scope.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() /
              ("moeserve_model_" + tag + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void rewrite_checkpoint(const std::string& fixture, const std::filesystem::path& dir, const TensorEdit& edit) {
  const auto src = fixture_dir(fixture);
  std::filesystem::copy_file(src / "config.json", dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  const io::Checkpoint ckpt = io::Checkpoint::open(src);
  TensorList out;
  for (const std::string& name : ckpt.names()) edit(name, ckpt.get(name), out);
  TensorList prefixed;
  for (auto& [name, t] : out) {
    const bool top = name.rfind("mtp.", 0) == 0 || name.rfind("lm_head.", 0) == 0;
    prefixed.emplace_back(top ? name : "model." + name, t);
  }
  io::write_safetensors(dir / "model.safetensors", prefixed);
}

inline void keep(const std::string& name, const Tensor& t, TensorList& out) { out.emplace_back(name, t); }

}  // namespace moeserve::model::testing
