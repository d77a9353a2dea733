#include "tools/convert_output_dir.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"

namespace moeserve::tools {

namespace fs = std::filesystem;

namespace {

fs::path normalized(const fs::path& p) { return fs::weakly_canonical(fs::absolute(p)).lexically_normal(); }

// Whether `inner` is `outer` or lies inside it.
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto o = outer.begin(), i = inner.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

// Whether process `pid` still runs: kill(pid, 0) succeeds for live processes and for zombies
// (exited, not yet reaped); /proc tells them apart on Linux.
bool process_running(long pid) {
  if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const size_t close = line.rfind(')');        // "pid (comm) state ..."; comm may hold spaces
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

// Removes ".NAME.convert-{tmp,old}-PID" siblings whose process no longer exists.
void remove_stale_staging(const fs::path& target) {
  const std::string name = target.filename().string();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(target.parent_path(), ec)) {
    const std::string n = entry.path().filename().string();
    for (const std::string kind : {".convert-tmp-", ".convert-old-"}) {
      const std::string stem = "." + name + kind;
      if (n.compare(0, stem.size(), stem) != 0) continue;
      const std::string pid_text = n.substr(stem.size());
      if (pid_text.empty() || !std::all_of(pid_text.begin(), pid_text.end(), ::isdigit)) continue;
      const long pid = std::stol(pid_text);
      if (pid == long(::getpid()) || process_running(pid)) continue;
      log::info("removing {} left behind by an interrupted convert (process {} is gone)", entry.path().string(), pid);
      std::error_code rm;
      fs::remove_all(entry.path(), rm);
    }
  }
}

bool skipped_file(const std::string& name) {
  auto ends = [&](std::string_view s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return ends(".safetensors") || name == "model.safetensors.index.json" ||
         (name.rfind("pytorch_model", 0) == 0 && (ends(".bin") || ends(".bin.index.json")));
}

void copy_tree(const fs::path& from, const fs::path& to, const fs::path& relative, bool top,
               const std::vector<std::string>& also_skip, std::vector<std::string>& copied) {
  std::vector<fs::directory_entry> entries;
  for (const auto& entry : fs::directory_iterator(from)) entries.push_back(entry);
  std::sort(entries.begin(), entries.end());
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (top && (skipped_file(name) || std::find(also_skip.begin(), also_skip.end(), name) != also_skip.end()))
      continue;
    const fs::path rel = relative / name;
    if (entry.is_directory()) {  // follows symlinks
      fs::create_directories(to / name);
      copy_tree(entry.path(), to / name, rel, false, also_skip, copied);
    } else if (entry.is_regular_file()) {
      fs::copy_file(entry.path(), to / name, fs::copy_options::overwrite_existing);
      copied.push_back(rel.string());
    }
  }
}

}  // namespace

StagingDir::StagingDir(const fs::path& target, bool force, const std::vector<fs::path>& inputs)
    : target_(normalized(target)), force_(force) {
  MOESERVE_CHECK(!target.empty(), "no output directory given");
  MOESERVE_CHECK(target_.has_filename() && target_ != target_.root_path(), "'{}' cannot be an output directory",
                 target.string());
  for (const fs::path& input : inputs) {
    const fs::path in = normalized(input);
    MOESERVE_CHECK(!is_within(in, target_) && !is_within(target_, in),
                   "the output directory '{}' {} the input checkpoint '{}'", target.string(),
                   in == target_ ? "is" : (is_within(in, target_) ? "contains" : "is inside"), input.string());
  }
  std::error_code ec;
  if (fs::exists(target_, ec)) {
    MOESERVE_CHECK(fs::is_directory(target_, ec), "'{}' exists and is not a directory", target.string());
    MOESERVE_CHECK(force, "'{}' already exists (pass --force to replace it)", target.string());
  }
  fs::create_directories(target_.parent_path());
  remove_stale_staging(target_);
  staging_ = target_.parent_path() / fmt::format(".{}.convert-tmp-{}", target_.filename().string(), ::getpid());
  fs::remove_all(staging_);
  fs::create_directory(staging_);
}

StagingDir::~StagingDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
  if (ec) log::warn("could not remove the staging directory {}: {}", staging_.string(), ec.message());
}

void StagingDir::commit() {
  MOESERVE_CHECK(!committed_, "output {} committed twice", target_.string());
  std::error_code ec;
  if (!fs::exists(target_, ec)) {
    fs::rename(staging_, target_);
    committed_ = true;
    return;
  }
  MOESERVE_CHECK(force_, "'{}' appeared while converting (pass --force to replace it)", target_.string());
  // Move the old directory aside first, so that a failure in between can be undone.
  const fs::path old = target_.parent_path() / fmt::format(".{}.convert-old-{}", target_.filename().string(), ::getpid());
  fs::remove_all(old);
  fs::rename(target_, old);
  try {
    fs::rename(staging_, target_);
  } catch (...) {
    fs::rename(old, target_, ec);
    throw;
  }
  committed_ = true;
  fs::remove_all(old, ec);
  if (ec) log::warn("could not remove the replaced directory {}: {}", old.string(), ec.message());
}

std::vector<std::string> copy_non_weight_files(const fs::path& from, const fs::path& to,
                                               const std::vector<std::string>& also_skip) {
  std::vector<std::string> copied;
  try {
    copy_tree(from, to, fs::path(), true, also_skip, copied);
  } catch (const fs::filesystem_error& e) {
    fail("cannot copy the files of {} to {}: {}", from.string(), to.string(), e.what());
  }
  return copied;
}

}  // namespace moeserve::tools
