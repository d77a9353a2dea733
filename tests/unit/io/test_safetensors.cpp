// Reading and writing well-formed safetensors files.
#include <gtest/gtest.h>

#include <cstring>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace moeserve::io {
namespace {

using testing::expect_error;
using testing::raw_safetensors;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

// The example file from the safetensors documentation (tensor.rs `deserialize` doc test):
// header length 0x3c = 60, one I32 [2, 2] tensor of 16 zero bytes.
const std::string kDocExample =
    std::string("<\0\0\0\0\0\0\0", 8) +
    R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})" + std::string(16, '\0');

TEST(Safetensors, ReadsTheDocumentationExample) {
  TempDir dir;
  write_file(dir / "doc.safetensors", kDocExample);
  auto file = SafetensorsFile::open(dir / "doc.safetensors");
  ASSERT_EQ(file->tensors().size(), 1u);
  const TensorInfo& info = file->tensors()[0];
  EXPECT_EQ(info.name, "test");
  EXPECT_EQ(info.dtype, DType::I32);
  EXPECT_EQ(info.shape, (Shape{2, 2}));
  EXPECT_EQ(info.data_begin, 0u);
  EXPECT_EQ(info.data_end, 16u);
  EXPECT_EQ(file->data_offset(), 8u + 60u);
  EXPECT_EQ(file->file_size(), kDocExample.size());
  Tensor t = file->tensor("test");
  EXPECT_EQ(t.nbytes(), 16u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.data<int32_t>()[i], 0);
  EXPECT_TRUE(file->metadata().empty());
}

TEST(Safetensors, WriterProducesTheDocumentedLayout) {
  // Same tensor as the documentation example, with the values 1..4: the header is the same
  // JSON, padded with spaces to a multiple of 8 bytes as the reference writer pads it.
  TempDir dir;
  const int32_t values[4] = {1, 2, 3, 4};
  SafetensorsWriter w(dir / "w.safetensors", {{"test", {DType::I32, {2, 2}}}});
  w.write_tensor("test", values, sizeof(values));
  w.finish();
  const std::string header = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  std::string data(16, '\0');
  std::memcpy(data.data(), values, 16);
  EXPECT_EQ(read_file(dir / "w.safetensors"), testing::le64(64) + header + "    " + data);
}

TEST(Safetensors, RoundTripsDtypesShapesOrderAndMetadata) {
  TempDir dir;
  const std::vector<float> f = {1.5f, -2.25f, 3e-8f, 65504.f, -0.0f, 7.f};
  Tensor f32 = Tensor::from_f32(f, {2, 3});
  Tensor bf16 = Tensor::empty(DType::BF16, {3, 2});
  for (size_t i = 0; i < f.size(); ++i) bf16.data<uint16_t>()[i] = f32_to_bf16(f[i]);
  Tensor fp8 = Tensor::empty(DType::F8_E4M3, {5});
  for (int i = 0; i < 5; ++i) fp8.data<uint8_t>()[i] = f32_to_fp8_e4m3(float(i) - 2.5f);
  Tensor i64 = Tensor::empty(DType::I64, {});  // a scalar
  i64.data<int64_t>()[0] = -1234567890123LL;
  Tensor empty = Tensor::empty(DType::F16, {0, 3});
  Tensor u8 = Tensor::empty(DType::U8, {3});
  for (int i = 0; i < 3; ++i) u8.data<uint8_t>()[i] = uint8_t(200 + i);

  // Names deliberately not sorted: the header keeps the writer's order.
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"z.f32", f32}, {"a.bf16", bf16}, {"m.fp8", fp8}, {"scalar", i64}, {"empty", empty}, {"odd.u8", u8}};
  write_safetensors(dir / "rt.safetensors", tensors, {{"format", "pt"}, {"note", "ünïcode"}});

  auto file = SafetensorsFile::open(dir / "rt.safetensors");
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, expected] = tensors[i];
    EXPECT_EQ(file->tensors()[i].name, name);
    Tensor got = file->tensor(name);
    EXPECT_EQ(got.dtype(), expected.dtype()) << name;
    EXPECT_EQ(got.shape(), expected.shape()) << name;
    ASSERT_EQ(got.nbytes(), expected.nbytes()) << name;
    EXPECT_EQ(std::memcmp(got.bytes(), expected.bytes(), got.nbytes()), 0) << name;
  }
  EXPECT_EQ(file->tensor("z.f32").to_f32(), f);
  EXPECT_EQ(file->tensor("scalar").data<int64_t>()[0], -1234567890123LL);
  EXPECT_EQ(file->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "ünïcode"}}));
  EXPECT_EQ(file->find("missing"), nullptr);
  ASSERT_NE(file->find("m.fp8"), nullptr);
  EXPECT_EQ(file->find("m.fp8")->dtype, DType::F8_E4M3);
  // Offsets are contiguous in declaration order.
  EXPECT_EQ(file->tensors()[0].data_begin, 0u);
  for (size_t i = 1; i < tensors.size(); ++i)
    EXPECT_EQ(file->tensors()[i].data_begin, file->tensors()[i - 1].data_end);
  EXPECT_EQ(file->data_offset() % 8, 0u);
}

TEST(Safetensors, TensorViewsKeepTheMappingAlive) {
  TempDir dir;
  write_safetensors(dir / "a.safetensors", {{"x", Tensor::from_f32({4.f, 5.f}, {2})}});
  Tensor t;
  {
    auto file = SafetensorsFile::open(dir / "a.safetensors");
    t = file->tensor("x");
  }
  EXPECT_EQ(t.to_f32(), (std::vector<float>{4.f, 5.f}));
  EXPECT_EQ(t.index0(1).to_f32(), (std::vector<float>{5.f}));
}

TEST(Safetensors, MissingTensorNamesTheFile) {
  TempDir dir;
  write_safetensors(dir / "a.safetensors", {{"x", Tensor::from_f32({1.f}, {1})}});
  auto file = SafetensorsFile::open(dir / "a.safetensors");
  expect_error([&] { file->tensor("y"); }, {"a.safetensors", "'y'"});
}

TEST(Safetensors, StreamsATensorInChunks) {
  TempDir dir;
  std::vector<uint16_t> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint16_t(i * 7);
  SafetensorsWriter w(dir / "s.safetensors",
                      {{"first", {DType::BF16, {10, 100}}}, {"none", {DType::F32, {0}}}, {"last", {DType::U8, {3}}}},
                      {{"k", "v"}});
  const auto* p = reinterpret_cast<const char*>(big.data());
  w.write_tensor("first", p, 1);  // odd-sized chunks are fine
  w.write_tensor("first", p + 1, 999);
  w.write_tensor("first", p + 1000, 1000);
  w.write_tensor("none", nullptr, 0);  // an explicit empty write of an empty tensor is accepted
  const uint8_t last[3] = {9, 8, 7};
  w.write_tensor("last", last, 3);
  w.finish();
  w.finish();  // idempotent
  auto file = SafetensorsFile::open(dir / "s.safetensors");
  EXPECT_EQ(std::memcmp(file->tensor("first").bytes(), big.data(), 2000), 0);
  EXPECT_EQ(file->tensor("none").numel(), 0);
  EXPECT_EQ(file->tensor("last").data<uint8_t>()[2], 7);
  EXPECT_EQ(file->metadata().at("k"), "v");
}

TEST(Safetensors, LargeTensorsBypassTheWriteBuffer) {
  TempDir dir;
  const size_t n = (size_t(9) << 20) / 4;  // 9 MiB of f32: larger than the write buffer
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i % 977) * 0.5f;
  write_safetensors(dir / "big.safetensors",
                    {{"small", Tensor::from_f32({1.f}, {1})}, {"big", Tensor::from_f32(v, {int64_t(n)})}});
  auto file = SafetensorsFile::open(dir / "big.safetensors");
  EXPECT_EQ(file->tensor("big").to_f32(), v);
  EXPECT_EQ(file->tensor("small").to_f32(), std::vector<float>{1.f});
}

TEST(Safetensors, WriterRejectsMisuse) {
  TempDir dir;
  const float x[4] = {};
  expect_error([&] { SafetensorsWriter(dir / "d.safetensors", {{"a", {DType::F32, {1}}}, {"a", {DType::F32, {1}}}}); },
               {"d.safetensors", "'a'", "twice"});
  expect_error([&] { SafetensorsWriter(dir / "m.safetensors", {{"__metadata__", {DType::F32, {1}}}}); },
               {"__metadata__"});
  expect_error([&] { SafetensorsWriter(dir / "n.safetensors", {{"a", {DType::F32, {-1}}}}); },
               {"'a'", "negative"});
  expect_error([&] { SafetensorsWriter(dir / "o.safetensors", {{"a", {DType::F32, {int64_t(1) << 62, 8}}}}); },
               {"'a'", "overflows"});
  {
    SafetensorsWriter w(dir / "order.safetensors", {{"a", {DType::F32, {2}}}, {"b", {DType::F32, {2}}}});
    expect_error([&] { w.write_tensor("b", x, 8); }, {"declared order", "expected 'a'"});
    expect_error([&] { w.write_tensor("a", x, 12); }, {"'a'", "exceed"});
    w.write_tensor("a", x, 8);
    expect_error([&] { w.finish(); }, {"order.safetensors", "'b'", "0 of 8"});
    w.write_tensor("b", x, 8);
    expect_error([&] { w.write_tensor("b", x, 4); }, {"already written"});
    w.finish();
    expect_error([&] { w.write_tensor("b", x, 4); }, {"after finish"});
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "order.safetensors"));
  expect_error([&] { SafetensorsWriter(dir / "no_such_dir" / "x.safetensors", {}); },
               {"cannot create", "no_such_dir"});
}

TEST(Safetensors, AbandonedWriterRemovesItsPartialFile) {
  TempDir dir;
  const float x[2] = {1.f, 2.f};
  {
    SafetensorsWriter w(dir / "partial.safetensors", {{"a", {DType::F32, {2}}}});
    w.write_tensor("a", x, 4);
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "partial.safetensors"));
}

TEST(Safetensors, AcceptsAHeaderOnlyFileAndSpacePadding) {
  TempDir dir;
  write_file(dir / "empty.safetensors", raw_safetensors("{}      ", ""));
  auto file = SafetensorsFile::open(dir / "empty.safetensors");
  EXPECT_TRUE(file->tensors().empty());
  // A null __metadata__ is "no metadata" (as an absent Option in the reference).
  write_file(dir / "null.safetensors", raw_safetensors(R"({"__metadata__":null})", ""));
  EXPECT_TRUE(SafetensorsFile::open(dir / "null.safetensors")->metadata().empty());
}

TEST(Safetensors, AcceptsEntriesInAnyOrderAndZeroSizedTensors) {
  // Header order differs from offset order; a zero-sized tensor sits between two others.
  TempDir dir;
  const std::string header =
      R"({"second":{"dtype":"U8","shape":[2],"data_offsets":[3,5]},)"
      R"("nothing":{"dtype":"F32","shape":[4,0],"data_offsets":[3,3]},)"
      R"("first":{"dtype":"U8","shape":[3],"data_offsets":[0,3],"extra":"ignored"}})";
  write_file(dir / "o.safetensors", raw_safetensors(header, "abcde"));
  auto file = SafetensorsFile::open(dir / "o.safetensors");
  ASSERT_EQ(file->tensors().size(), 3u);
  EXPECT_EQ(file->tensors()[0].name, "second");
  EXPECT_EQ(file->tensors()[2].name, "first");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file->tensor("second").bytes()), 2), "de");
  EXPECT_EQ(file->tensor("nothing").shape(), (Shape{4, 0}));
}

}  // namespace
}  // namespace moeserve::io
