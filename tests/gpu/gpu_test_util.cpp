#include "gpu_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <sstream>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_info.h"

namespace moeserve::gputest {

bool have_gpu() {
  static const bool any = !cuda::list_devices().empty();
  return any;
}

void round_bf16_inplace(std::vector<float>& v) {
  for (float& x : v) x = round_bf16(x);
}

std::vector<float> random_bf16(Rng& rng, size_t n, float scale) {
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(rng.normal() * scale);
  return v;
}

std::vector<float> random_bf16_uniform(Rng& rng, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(rng.uniform(lo, hi));
  return v;
}

std::vector<float> random_f32(Rng& rng, size_t n, float scale) {
  std::vector<float> v(n);
  for (float& x : v) x = rng.normal() * scale;
  return v;
}

DeviceBuffer<bf16> to_device_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  DeviceBuffer<bf16> d(std::max<size_t>(v.size(), 1));
  if (!v.empty()) d.upload(reinterpret_cast<const bf16*>(h.data()), h.size());
  sync_device();
  return d;
}

DeviceBuffer<float> to_device_f32(const std::vector<float>& v) {
  DeviceBuffer<float> d(std::max<size_t>(v.size(), 1));
  if (!v.empty()) d.upload(v.data(), v.size());
  sync_device();
  return d;
}

DeviceBuffer<int32_t> to_device_i32(const std::vector<int32_t>& v) {
  DeviceBuffer<int32_t> d(std::max<size_t>(v.size(), 1));
  if (!v.empty()) d.upload(v.data(), v.size());
  sync_device();
  return d;
}

std::vector<float> to_host(const DeviceBuffer<bf16>& d) {
  sync_device();
  const std::vector<bf16> raw = d.download();
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, &raw[i], 2);
    out[i] = bf16_to_f32(bits);
  }
  return out;
}

std::vector<float> to_host(const DeviceBuffer<float>& d) {
  sync_device();
  return d.download();
}

std::vector<int32_t> to_host(const DeviceBuffer<int32_t>& d) {
  sync_device();
  return d.download();
}

void sync_device() {
  MOESERVE_CUDA_CHECK(cudaDeviceSynchronize());
  MOESERVE_CUDA_CHECK(cudaGetLastError());
}

std::string coords(size_t flat, const std::vector<int64_t>& dims) {
  std::vector<int64_t> c(dims.size());
  for (size_t i = dims.size(); i-- > 0;) {
    const int64_t d = std::max<int64_t>(dims[i], 1);
    c[i] = int64_t(flat % size_t(d));
    flat /= size_t(d);
  }
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < c.size(); ++i) s << (i ? ", " : "") << c[i];
  s << "]";
  return s.str();
}

std::string shape_str(const std::vector<int64_t>& dims, const std::vector<std::string>& names) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    s << (i ? ", " : "");
    if (i < names.size()) s << names[i] << "=";
    s << dims[i];
  }
  s << "]";
  return s.str();
}

ErrorStats error_stats(const std::vector<float>& got, const std::vector<float>& ref) {
  ErrorStats e;
  double num2 = 0, den2 = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    const double d = std::abs(double(got[i]) - double(ref[i]));
    if (!(d <= e.max_abs)) {  // also catches NaN
      e.max_abs = std::isnan(d) ? INFINITY : d;
      e.worst = i;
    }
    e.max_ref = std::max(e.max_ref, std::abs(double(ref[i])));
    num2 += d * d;
    den2 += double(ref[i]) * double(ref[i]);
  }
  e.rel = e.max_ref > 0 ? e.max_abs / e.max_ref : e.max_abs;
  e.rms_rel = den2 > 0 ? std::sqrt(num2 / den2) : std::sqrt(num2);
  return e;
}

::testing::AssertionResult all_close(const std::string& what, const std::vector<float>& got,
                                     const std::vector<float>& ref, const std::vector<int64_t>& dims,
                                     const std::vector<std::string>& dim_names, double atol, double rtol,
                                     const std::vector<float>* bound) {
  const std::string shape = shape_str(dims, dim_names);
  const size_t expect_n = size_t(std::accumulate(dims.begin(), dims.end(), int64_t(1), std::multiplies<>()));
  if (got.size() < expect_n || ref.size() < expect_n)
    return ::testing::AssertionFailure() << what << " " << shape << ": got " << got.size() << " values, reference "
                                         << ref.size() << ", shape needs " << expect_n;
  ErrorStats e = error_stats(std::vector<float>(got.begin(), got.begin() + long(expect_n)),
                             std::vector<float>(ref.begin(), ref.begin() + long(expect_n)));
  size_t worst = 0;
  for (size_t i = 0; i < expect_n; ++i) {
    const double d = std::abs(double(got[i]) - double(ref[i]));
    const double tol = atol + rtol * std::abs(double(ref[i])) + (bound ? double((*bound)[i]) : 0.0);
    const double ratio = std::isnan(d) ? INFINITY : (tol > 0 ? d / tol : (d > 0 ? INFINITY : 0.0));
    if (ratio > 1.0) ++e.violations;
    if (ratio > e.worst_ratio) {
      e.worst_ratio = ratio;
      worst = i;
    }
  }
  std::printf("[%s] %s max abs err %.3e, rel (max|d|/max|ref|) %.3e, rms rel %.3e, worst d/tol %.3f, %zu/%zu outside\n",
              what.c_str(), shape.c_str(), e.max_abs, e.rel, e.rms_rel, e.worst_ratio, e.violations, expect_n);
  if (e.violations == 0) return ::testing::AssertionSuccess();
  const double tol_w =
      atol + rtol * std::abs(double(ref[worst])) + (bound ? double((*bound)[worst]) : 0.0);
  return ::testing::AssertionFailure()
         << what << " " << shape << ": " << e.violations << " of " << expect_n
         << " elements outside |got-ref| <= " << atol << " + " << rtol << "*|ref|" << (bound ? " + bound" : "")
         << "\n  max abs err " << e.max_abs << " at " << coords(e.worst, dims) << " (got " << got[e.worst] << ", ref "
         << ref[e.worst] << ")"
         << "\n  worst relative to its tolerance at " << coords(worst, dims) << ": got " << got[worst] << ", ref "
         << ref[worst] << ", tol " << tol_w << " (" << e.worst_ratio << "x)"
         << "\n  max|ref| " << e.max_ref << ", rel err max|d|/max|ref| " << e.rel << ", rms rel " << e.rms_rel;
}

std::vector<float> dot_bounds(const std::vector<float>& absdot, int64_t k) {
  std::vector<float> b(absdot.size());
  const double c = 8.0 * std::sqrt(double(std::max<int64_t>(k, 1))) * kEpsF32;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(c * double(absdot[i]));
  return b;
}

int assign_shuffled_blocks(Rng& rng, std::vector<SeqSpec>& seqs, int block_size, int spare_blocks) {
  int total = spare_blocks;
  for (const auto& s : seqs) total += (s.start_pos + s.num_tokens + block_size - 1) / block_size;
  std::vector<int32_t> pool(static_cast<size_t>(total));
  std::iota(pool.begin(), pool.end(), 0);
  for (size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[size_t(rng.integer(0, int64_t(i) - 1))]);
  size_t next = 0;
  for (auto& s : seqs) {
    const int need = (s.start_pos + s.num_tokens + block_size - 1) / block_size;
    s.blocks.assign(pool.begin() + long(next), pool.begin() + long(next) + need);
    next += size_t(need);
  }
  return total;
}

DeviceStepMeta::DeviceStepMeta(const std::vector<SeqSpec>& seqs, int max_blocks_per_seq) {
  const size_t S = seqs.size();
  std::vector<int32_t> start_pos(S), slots(S), tables(S * size_t(max_blocks_per_seq), 0);
  seq_token_start.assign(S + 1, 0);
  for (size_t i = 0; i < S; ++i) {
    const auto& s = seqs[i];
    seq_token_start[i + 1] = seq_token_start[i] + s.num_tokens;
    start_pos[i] = s.start_pos;
    slots[i] = s.state_slot;
    if (int(s.blocks.size()) > max_blocks_per_seq) throw Error("DeviceStepMeta: block table longer than the stride");
    std::copy(s.blocks.begin(), s.blocks.end(), tables.begin() + long(i * size_t(max_blocks_per_seq)));
    for (int t = 0; t < s.num_tokens; ++t) {
      token_seq.push_back(int32_t(i));
      token_pos.push_back(s.start_pos + t);
    }
  }
  token_seq_ = to_device_i32(token_seq);
  token_pos_ = to_device_i32(token_pos);
  seq_token_start_ = to_device_i32(seq_token_start);
  seq_start_pos_ = to_device_i32(start_pos);
  seq_state_slot_ = to_device_i32(slots);
  block_tables_ = to_device_i32(tables);
  meta_.num_tokens = int(token_seq.size());
  meta_.num_seqs = int(S);
  meta_.max_blocks_per_seq = max_blocks_per_seq;
  meta_.token_seq = token_seq_.data();
  meta_.token_pos = token_pos_.data();
  meta_.seq_token_start = seq_token_start_.data();
  meta_.seq_start_pos = seq_start_pos_.data();
  meta_.seq_state_slot = seq_state_slot_.data();
  meta_.block_tables = block_tables_.data();
}

}  // namespace moeserve::gputest
