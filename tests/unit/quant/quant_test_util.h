// Helpers for the quant tests: temporary checkpoints written with io's SafetensorsWriter,
// tensors from plain vectors, the transformers fixtures (tests/fixtures/qwen35).
#pragma once
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "core/tensor.h"
#include "io/checkpoint.h"
#include "io/qwen35_config.h"
#include "io/safetensors.h"
#include "quant/quant_weight.h"

namespace moeserve::quant::testing {

// The message of the moeserve::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A directory removed at the end of its scope; unique per process and instance.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("moeserve_quant_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

template <typename T>
Tensor make_tensor(DType dtype, Shape shape, const std::vector<T>& values) {
  Tensor t = Tensor::empty(dtype, std::move(shape));
  if (t.nbytes() != values.size() * sizeof(T)) throw Error("make_tensor: size mismatch");
  std::memcpy(t.bytes(), values.data(), t.nbytes());
  return t;
}

inline Tensor f32_tensor(Shape shape, const std::vector<float>& v) { return make_tensor(DType::F32, std::move(shape), v); }
inline Tensor i32_tensor(Shape shape, const std::vector<int32_t>& v) {
  return make_tensor(DType::I32, std::move(shape), v);
}
inline Tensor u8_tensor(DType dtype, Shape shape, const std::vector<uint8_t>& v) {
  return make_tensor(dtype, std::move(shape), v);
}
inline Tensor f16_tensor(Shape shape, const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(f32_to_f16(x));
  return make_tensor(DType::F16, std::move(shape), h);
}
inline Tensor bf16_tensor(Shape shape, const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(f32_to_bf16(x));
  return make_tensor(DType::BF16, std::move(shape), h);
}

// Writes DIR/model.safetensors with the given tensors (names as on disk).
inline void write_model(const std::filesystem::path& dir, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  io::write_safetensors(dir / "model.safetensors", tensors);
}

// A Qwen35Config carrying only a quantization_config (what LinearLoader reads).
inline io::Qwen35Config config_with(const nlohmann::json& quantization_config) {
  io::Qwen35Config c;
  if (!quantization_config.is_null())
    c.quantization = io::parse_quantization_config(quantization_config, "config.json");
  return c;
}

inline std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(MOESERVE_FIXTURES_DIR) / "qwen35" / name;
}

// Max |a - b| over two equal-length vectors (infinity when lengths differ).
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

// Every row of W in fp32.
inline std::vector<float> dequantize_all(const QuantWeight& w) {
  std::vector<float> out(size_t(w.out_features * w.in_features));
  w.dequantize_rows(0, w.out_features, out.data());
  return out;
}

}  // namespace moeserve::quant::testing
