// Atomic output for `moeserve convert`: everything is written into a hidden staging directory
// next to the destination (".NAME.convert-tmp-PID", same filesystem, so the final rename is
// atomic) and renamed into place only when complete. On any failure the staging directory is
// removed and the destination is untouched: nothing new appears at DST, and with --force the
// old DST stays as it was. Staging directories left behind by a killed run (their PID gone) are
// removed by the next run for the same destination.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace moeserve::tools {

class StagingDir {
 public:
  // Throws when `target` exists and !force, when it exists and is not a directory, or when it
  // overlaps one of `inputs` (the checkpoints being read): is one, contains one or lies inside one.
  StagingDir(const std::filesystem::path& target, bool force, const std::vector<std::filesystem::path>& inputs);
  ~StagingDir();  // removes the staging directory unless committed
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  const std::filesystem::path& path() const { return staging_; }
  const std::filesystem::path& target() const { return target_; }
  // Moves the staging directory to the target (replacing an existing one with --force).
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path staging_;
  bool force_;
  bool committed_ = false;
};

// Copies the files of a checkpoint directory that are not weights (tokenizer, chat template,
// generation config, README, ...) into `to`, following symlinks (a Hugging Face cache snapshot
// links into blobs/). Skipped: *.safetensors, model.safetensors.index.json, pytorch_model*.bin
// and its index, hidden entries (".git", ".cache"), and the names in `also_skip`. Sub-directories
// are copied recursively. Returns the relative paths copied.
std::vector<std::string> copy_non_weight_files(const std::filesystem::path& from, const std::filesystem::path& to,
                                               const std::vector<std::string>& also_skip);

}  // namespace moeserve::tools
