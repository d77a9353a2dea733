// Every malformed safetensors file is a moeserve::Error that names the file and, where there
// is one, the tensor; never a crash. Most cases go through the in-memory parser (the same
// code SafetensorsFile::open runs); a few go through real files.
#include <gtest/gtest.h>

#include <unistd.h>

#include <span>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace moeserve::io {
namespace {

using testing::expect_error;
using testing::le64;
using testing::raw_safetensors;
using testing::TempDir;
using testing::write_file;

void expect_rejected(const std::string& file_bytes, const std::vector<std::string>& parts) {
  std::vector<std::string> all = {"bad.safetensors"};
  all.insert(all.end(), parts.begin(), parts.end());
  expect_error(
      [&] {
        parse_safetensors_header(std::as_bytes(std::span(file_bytes.data(), file_bytes.size())),
                                 "bad.safetensors");
      },
      all);
}

// A one-tensor header around the given entry JSON, with `data` bytes of data.
std::string one(const std::string& entry, const std::string& data) {
  return raw_safetensors(R"({"w":)" + entry + "}", data);
}

TEST(SafetensorsMalformed, ShorterThanTheLengthField) {
  expect_rejected("", {"0 bytes", "too short"});
  expect_rejected(std::string(7, '\0'), {"7 bytes", "too short"});
}

TEST(SafetensorsMalformed, HeaderLengthPastTheEndOfTheFile) {
  expect_rejected(le64(100) + "{}", {"header length 100", "past the end"});
  expect_rejected(le64(~uint64_t(0) - 3) + "{}", {"exceeds the limit"});
}

TEST(SafetensorsMalformed, HeaderLengthAbsurd) {
  expect_rejected(le64(uint64_t(1) << 40) + "{}", {"exceeds the limit"});
  expect_rejected(le64(kMaxSafetensorsHeaderSize + 1) + "{}", {"exceeds the limit"});
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  expect_rejected(raw_safetensors("{not json", ""), {"not valid JSON"});
  expect_rejected(raw_safetensors(R"({"a":1} trailing)", ""), {"not valid JSON"});
  expect_rejected(raw_safetensors("", ""), {"starting with '{'"});
}

TEST(SafetensorsMalformed, HeaderNotAnObject) {
  expect_rejected(raw_safetensors("[1,2]", ""), {"starting with '{'"});
  expect_rejected(raw_safetensors("  {}", ""), {"starting with '{'"});
  expect_rejected(raw_safetensors("\"x\"", ""), {"starting with '{'"});
}

TEST(SafetensorsMalformed, InvalidUtf8) {
  expect_rejected(raw_safetensors("{\"w\xff\":{}}", ""), {"not valid JSON"});
}

TEST(SafetensorsMalformed, EntryNotAnObject) {
  expect_rejected(one("[1]", ""), {"tensor 'w'", "JSON object"});
  expect_rejected(one("7", ""), {"tensor 'w'", "JSON object"});
}

TEST(SafetensorsMalformed, EntryMissingFields) {
  expect_rejected(one(R"({"shape":[1],"data_offsets":[0,1]})", "x"), {"tensor 'w'", "missing field 'dtype'"});
  expect_rejected(one(R"({"dtype":"U8","data_offsets":[0,1]})", "x"), {"tensor 'w'", "missing field 'shape'"});
  expect_rejected(one(R"({"dtype":"U8","shape":[1]})", "x"), {"tensor 'w'", "missing field 'data_offsets'"});
}

TEST(SafetensorsMalformed, FieldsOfTheWrongType) {
  expect_rejected(one(R"({"dtype":3,"shape":[1],"data_offsets":[0,1]})", "x"), {"tensor 'w'", "dtype must be a string"});
  expect_rejected(one(R"({"dtype":"U8","shape":1,"data_offsets":[0,1]})", "x"), {"tensor 'w'", "shape must be an array"});
  expect_rejected(one(R"({"dtype":"U8","shape":[1],"data_offsets":"0,1"})", "x"), {"tensor 'w'", "data_offsets"});
  expect_rejected(one(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,2]})", "x"), {"tensor 'w'", "data_offsets"});
  expect_rejected(one(R"({"dtype":"U8","shape":[1],"data_offsets":[0,"1"]})", "x"), {"tensor 'w'", "data_offsets"});
  expect_rejected(one(R"({"dtype":"U8","shape":[1],"data_offsets":[-1,1]})", "x"), {"tensor 'w'", "negative"});
}

TEST(SafetensorsMalformed, UnknownDtype) {
  expect_rejected(one(R"({"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]})", "x"), {"tensor 'w'", "'Q4_K'"});
  expect_rejected(one(R"({"dtype":"bf16","shape":[1],"data_offsets":[0,2]})", "xx"), {"tensor 'w'", "'bf16'"});
}

TEST(SafetensorsMalformed, BadShapeDimensions) {
  expect_rejected(one(R"({"dtype":"U8","shape":[-1],"data_offsets":[0,1]})", "x"), {"tensor 'w'", "negative value -1"});
  expect_rejected(one(R"({"dtype":"U8","shape":[1.5],"data_offsets":[0,1]})", "x"), {"tensor 'w'", "non-negative integers"});
  expect_rejected(one(R"({"dtype":"U8","shape":[1.0],"data_offsets":[0,1]})", "x"), {"tensor 'w'", "non-negative integers"});
  expect_rejected(one(R"({"dtype":"U8","shape":["1"],"data_offsets":[0,1]})", "x"), {"tensor 'w'", "non-negative integers"});
  expect_rejected(one(R"({"dtype":"U8","shape":[[1]],"data_offsets":[0,1]})", "x"), {"tensor 'w'", "nested deeper"});
  expect_rejected(one(R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]})", "x"), {"tensor 'w'", "too large"});
}

TEST(SafetensorsMalformed, ElementOrByteCountOverflows) {
  // 2^32 * 2^32 elements overflow uint64; 2^62 F32 elements overflow the byte count.
  expect_rejected(one(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]})", ""),
                  {"tensor 'w'", "overflows"});
  expect_rejected(one(R"({"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]})", ""),
                  {"tensor 'w'", "overflows"});
  // Even with a zero dimension later (the reference rejects it too).
  expect_rejected(one(R"({"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]})", ""),
                  {"tensor 'w'", "overflows"});
}

TEST(SafetensorsMalformed, OffsetsReversedOrPastTheData) {
  expect_rejected(one(R"({"dtype":"U8","shape":[1],"data_offsets":[2,1]})", "xx"), {"tensor 'w'", "begin after end"});
  expect_rejected(one(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})", "xx"),
                  {"tensor 'w'", "past the end of the data section (2 bytes)", "truncated"});
  expect_rejected(one(R"({"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551615]})", "xx"),
                  {"tensor 'w'", "past the end"});
}

TEST(SafetensorsMalformed, ByteSizeDisagreesWithShape) {
  expect_rejected(one(R"({"dtype":"BF16","shape":[2,2],"data_offsets":[0,6]})", "123456"),
                  {"tensor 'w'", "hold 6 bytes", "BF16 [2, 2] needs 8"});
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  const std::string header = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})";
  expect_rejected(raw_safetensors(header, "123456"), {"'b'", "overlaps tensor 'a'"});
  // Two tensors on the same bytes.
  const std::string same = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
  expect_rejected(raw_safetensors(same, "1234"), {"overlaps"});
}

TEST(SafetensorsMalformed, HolesBetweenOrBeforeTensors) {
  const std::string gap = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                          R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})";
  expect_rejected(raw_safetensors(gap, "12345"), {"1 unused bytes", "'a'", "'b'"});
  expect_rejected(one(R"({"dtype":"U8","shape":[2],"data_offsets":[1,3]})", "123"),
                  {"1 unused bytes at the start", "'w'"});
}

TEST(SafetensorsMalformed, TrailingBytesAfterTheLastTensor) {
  expect_rejected(one(R"({"dtype":"U8","shape":[2],"data_offsets":[0,2]})", "1234"), {"2 trailing bytes"});
  expect_rejected(raw_safetensors("{}", "x"), {"1 trailing bytes"});
}

TEST(SafetensorsMalformed, DuplicateKeys) {
  const std::string dup = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  expect_rejected(raw_safetensors(dup, "12"), {"'a' twice"});
  expect_rejected(raw_safetensors(R"({"__metadata__":{},"__metadata__":{}})", ""), {"'__metadata__' twice"});
}

TEST(SafetensorsMalformed, BadMetadata) {
  expect_rejected(raw_safetensors(R"({"__metadata__":[1]})", ""), {"__metadata__ must be an object"});
  expect_rejected(raw_safetensors(R"({"__metadata__":{"format":1}})", ""), {"__metadata__", "'format'", "string"});
}

TEST(SafetensorsMalformed, DeeplyNestedJson) {
  const std::string deep = R"({"w":{"dtype":"U8","shape":)" + std::string(100000, '[') + std::string(100000, ']') +
                           R"(,"data_offsets":[0,0]}})";
  expect_rejected(raw_safetensors(deep, ""), {"tensor 'w'", "nested deeper"});
}

TEST(SafetensorsMalformed, FilesThatCannotBeMapped) {
  TempDir dir;
  write_file(dir / "zero.safetensors", "");
  expect_error([&] { SafetensorsFile::open(dir / "zero.safetensors"); }, {"zero.safetensors", "empty"});
  expect_error([&] { SafetensorsFile::open(dir / "absent.safetensors"); },
               {"cannot open", "absent.safetensors", "No such file"});
  std::filesystem::create_directories(dir / "dir.safetensors");
  expect_error([&] { SafetensorsFile::open(dir / "dir.safetensors"); }, {"dir.safetensors", "not a regular file"});
  write_file(dir / "short.safetensors", "abc");
  expect_error([&] { SafetensorsFile::open(dir / "short.safetensors"); }, {"short.safetensors", "too short"});
}

TEST(SafetensorsMalformed, UnreadableFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files regardless of their mode";
  TempDir dir;
  write_safetensors(dir / "locked.safetensors", {{"a", Tensor::from_f32({1}, {1})}});
  std::filesystem::permissions(dir / "locked.safetensors", std::filesystem::perms::none);
  expect_error([&] { SafetensorsFile::open(dir / "locked.safetensors"); },
               {"cannot open", "locked.safetensors", "Permission denied"});
}

TEST(SafetensorsMalformed, TruncatedFileOnDisk) {
  // A valid file cut short: the last tensor runs past the data section.
  TempDir dir;
  write_safetensors(dir / "full.safetensors",
                    {{"a", Tensor::from_f32({1, 2, 3}, {3})}, {"b", Tensor::from_f32({4, 5, 6, 7}, {4})}});
  std::string bytes = testing::read_file(dir / "full.safetensors");
  write_file(dir / "cut.safetensors", bytes.substr(0, bytes.size() - 5));
  expect_error([&] { SafetensorsFile::open(dir / "cut.safetensors"); },
               {"cut.safetensors", "tensor 'b'", "truncated"});
}

}  // namespace
}  // namespace moeserve::io
