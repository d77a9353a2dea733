// Access to the transformers reference fixtures (tests/fixtures/qwen35/<name>/, made by
// tests/fixtures/make_qwen35_fixtures.py with transformers 5.17) from the model tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace moeserve::model::testing {

inline std::filesystem::path fixtures_root() { return std::filesystem::path(MOESERVE_FIXTURES_DIR) / "qwen35"; }

inline std::filesystem::path fixture_dir(const std::string& name) { return fixtures_root() / name; }

// Every fixture folder that has a reference, sorted.
inline std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  if (!std::filesystem::exists(fixtures_root())) return names;
  for (const auto& e : std::filesystem::directory_iterator(fixtures_root()))
    if (e.is_directory() && std::filesystem::exists(e.path() / "reference.safetensors"))
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// True when config.json declares a quantization_config (INT4, FP8, NVFP4 fixtures).
inline bool is_quantized(const std::string& name) {
  const auto j = read_json(fixture_dir(name) / "config.json");
  return j.contains("quantization_config");
}

class Reference {
 public:
  explicit Reference(const std::string& name)
      : file_(io::SafetensorsFile::open(fixture_dir(name) / "reference.safetensors")) {}
  bool has(const std::string& t) const { return file_->find(t) != nullptr; }
  std::vector<float> floats(const std::string& t) const { return file_->tensor(t).to_f32(); }
  std::vector<int32_t> ids(const std::string& t) const {
    const Tensor x = file_->tensor(t);
    std::vector<int32_t> out(size_t(x.numel()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = int32_t(x.data<int64_t>()[i]);
    return out;
  }
  Shape shape(const std::string& t) const { return file_->tensor(t).shape(); }

 private:
  std::shared_ptr<io::SafetensorsFile> file_;
};

// max |a − b| / max |b|
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return a.size() != b.size() ? INFINITY : (den > 0 ? num / den : num);
}

}  // namespace moeserve::model::testing
