#include "moe_int_test_util.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>

namespace moeserve::gputest {

std::string case_name(const IntCase& c) {
  return std::string(c.sym ? "sym" : "asym") + " g" + std::to_string(c.group) + " E=" + std::to_string(c.E) +
         " k=" + std::to_string(c.k) + " H=" + std::to_string(c.H) + " I=" + std::to_string(c.I);
}

cuda::MoeShape shape_of(const IntCase& c) { return {c.E, c.k, c.H, c.I}; }

IntExperts make_experts(Rng& rng, const IntCase& c) {
  IntExperts ex;
  for (int e = 0; e < c.E; ++e) {
    ex.gate.push_back(make_gptq(rng, c.I, c.H, c.group, c.sym, false, 0.005f));
    ex.up.push_back(make_gptq(rng, c.I, c.H, c.group, c.sym, false, 0.005f));
    ex.down.push_back(make_gptq(rng, c.H, c.I, c.group, c.sym, false, 0.005f));
  }
  return ex;
}

std::vector<const quant::QuantWeight*> ptrs(const std::vector<TestWeight>& v) {
  std::vector<const quant::QuantWeight*> p;
  for (const auto& t : v) p.push_back(&t.weight);
  return p;
}

IntFormExperts ref_of(const IntExperts& ex) { return {ptrs(ex.gate), ptrs(ex.up), ptrs(ex.down)}; }

cuda::DeviceExperts upload(const IntExperts& ex) {
  return cuda::upload_experts(ptrs(ex.gate), ptrs(ex.up), ptrs(ex.down), nullptr);
}

DecodeMaxGuard::DecodeMaxGuard(int max_tokens) : saved_(cuda::moe_int_decode_max_tokens()) {
  cuda::set_moe_int_decode_max_tokens(max_tokens);
}

DecodeMaxGuard::~DecodeMaxGuard() { cuda::set_moe_int_decode_max_tokens(saved_); }

DeviceBuffer<uint8_t> fresh_workspace(const IntCase& c, int M) {
  DeviceBuffer<uint8_t> ws(std::max<size_t>(1, cuda::moe_int_workspace_bytes(shape_of(c), M)));
  if (cudaMemset(ws.data(), 0xFF, ws.bytes()) != cudaSuccess) throw std::runtime_error("cudaMemset failed");
  return ws;
}

std::vector<float> run_int(const cuda::DeviceExperts& d, const IntCase& c, int M, const std::vector<float>& x,
                           const std::vector<float>& logits, const std::vector<float>& residual, bool* ran,
                           const IntRun& opt) {
  std::optional<DecodeMaxGuard> guard;
  if (opt.decode_max >= 0) guard.emplace(opt.decode_max);
  DeviceBuffer<uint8_t> own;
  DeviceBuffer<uint8_t>* ws = opt.ws;
  if (!ws) {
    own = fresh_workspace(c, M);
    ws = &own;
  }
  std::vector<float> xs(size_t(opt.x_offset), 0.0f);
  xs.insert(xs.end(), x.begin(), x.end());
  auto d_x = to_device_f32(xs);
  auto d_logits = to_device_f32(logits);
  auto d_res = to_device_f32(residual);
  DeviceBuffer<float> d_shared, d_gate;
  if (opt.shared) {
    d_shared = to_device_f32(*opt.shared);
    d_gate = to_device_f32(*opt.gate);
  }
  *ran = cuda::moe_routed_experts_int(d_x.data() + opt.x_offset, d_logits.data(), shape_of(c), d, M, ws->data(),
                                      ws->bytes(), d_res.data(), nullptr, opt.shared ? d_shared.data() : nullptr,
                                      opt.shared ? d_gate.data() : nullptr);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) throw std::runtime_error(std::string("moe_routed_experts_int: ") + cudaGetErrorString(err));
  return to_host(d_res);
}

bool bits_equal(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

int count_diffs(const std::vector<float>& got, size_t off, const std::vector<float>& ref, size_t roff, size_t n,
                size_t* first) {
  int diffs = 0;
  for (size_t i = 0; i < n; ++i)
    if (!bits_equal(got[off + i], ref[roff + i]) && diffs++ == 0) *first = i;
  return diffs;
}

int count_diffs(const std::vector<float>& got, const std::vector<float>& ref, size_t* first) {
  return count_diffs(got, 0, ref, 0, got.size(), first);
}

}  // namespace moeserve::gputest
