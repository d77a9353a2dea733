// Helpers for the convert tests: temporary directories, whole-checkpoint tensor maps, and the
// published dequantisation formulas written out independently of src/quant (spec 4.1 / 4.2),
// so the quantisers are checked against the format definition rather than against themselves.
#pragma once
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace moeserve::tools::testing {

namespace fs = std::filesystem;

inline fs::path fixture(const std::string& name) { return fs::path(MOESERVE_FIXTURES_DIR) / "qwen35" / name; }

// A fresh directory under /tmp, removed at destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = fs::temp_directory_path() / ("moeserve_convert_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
inline nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(read_text(p)); }

// One stored tensor: dtype, shape and bytes.
struct StoredTensor {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
  bool operator==(const StoredTensor& o) const { return dtype == o.dtype && shape == o.shape && bytes == o.bytes; }
};

// Every tensor of a checkpoint directory by stored name (read through io::Checkpoint, so the
// index decides what belongs to the model), vision tower included.
inline std::map<std::string, StoredTensor> read_all_tensors(const fs::path& dir) {
  const io::Checkpoint ckpt = io::Checkpoint::open(dir);
  std::map<std::string, StoredTensor> out;
  for (const auto& file : ckpt.files())
    for (const io::TensorInfo& info : file->tensors()) {
      const Tensor t = file->tensor(info.name);
      StoredTensor s{t.dtype(), t.shape(), {}};
      s.bytes.assign(reinterpret_cast<const uint8_t*>(t.bytes()), reinterpret_cast<const uint8_t*>(t.bytes()) + t.nbytes());
      out[info.name] = std::move(s);
    }
  return out;
}

inline std::vector<float> to_floats(const StoredTensor& t) {
  std::vector<float> out(size_t(shape_numel(t.shape)));
  convert_to_f32(t.dtype, t.bytes.data(), out.data(), out.size());
  return out;
}

template <typename T>
T element(const StoredTensor& t, size_t i) {
  T v;
  std::memcpy(&v, t.bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

// Spec 4.1: W[n, k] = (q[k, n] − zero[k/g, n]) · scales[k/g, n], q from qweight [K/8, N] (low
// nibble first along K), zero = nibble of qzeros [K/g, N/8] (along N) + 1.
inline std::vector<float> gptq_dequantize(const StoredTensor& qweight, const StoredTensor& qzeros,
                                          const StoredTensor& scales) {
  const int64_t K = qweight.shape[0] * 8, N = qweight.shape[1], G = scales.shape[0], g = K / G;
  std::vector<float> W(size_t(N * K));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      const uint32_t word = uint32_t(element<int32_t>(qweight, size_t((k / 8) * N + n)));
      const int q = int((word >> (4 * (k % 8))) & 0xF);
      const uint32_t zword = uint32_t(element<int32_t>(qzeros, size_t((k / g) * (N / 8) + n / 8)));
      const int zero = int((zword >> (4 * (n % 8))) & 0xF) + 1;
      const float s = f16_to_f32(element<uint16_t>(scales, size_t((k / g) * N + n)));
      W[size_t(n * K + k)] = float(q - zero) * s;
    }
  return W;
}

// Spec 4.2: W[n, k] = fp8(weight[n, k]) · weight_scale_inv[n/128, k/128].
inline std::vector<float> fp8_dequantize(const StoredTensor& weight, const StoredTensor& scale_inv) {
  const int64_t N = weight.shape[0], K = weight.shape[1], KB = scale_inv.shape[1];
  const std::vector<float> s = to_floats(scale_inv);
  std::vector<float> W(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      W[size_t(n * K + k)] = fp8_e4m3_to_f32(weight.bytes[size_t(n * K + k)]) * s[size_t((n / 128) * KB + k / 128)];
  return W;
}

// max |a − b| / max |b|
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return a.size() != b.size() ? INFINITY : (den > 0 ? num / den : num);
}

}  // namespace moeserve::tools::testing
