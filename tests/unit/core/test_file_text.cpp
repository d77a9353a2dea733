// read_file_text / try_read_file_text: exact bytes, and errors that name the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/file_text.h"

namespace moeserve {
namespace {

std::filesystem::path temp_file(const std::string& name, const std::string& bytes) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(FileText, ReadsEveryByte) {
  const std::string bytes("line 1\r\nzero \0 byte \xff\n", 22);
  const auto path = temp_file("moeserve_file_text_test.bin", bytes);
  EXPECT_EQ(read_file_text(path), bytes);
  EXPECT_EQ(try_read_file_text(path), bytes);
  EXPECT_EQ(read_file_text(temp_file("moeserve_file_text_empty.bin", "")), "");
  std::filesystem::remove(path);
}

TEST(FileText, MissingFileNamesItself) {
  const auto path = std::filesystem::temp_directory_path() / "moeserve_no_such_file.json";
  std::filesystem::remove(path);
  EXPECT_EQ(try_read_file_text(path), std::nullopt);
  try {
    read_file_text(path, "chat template file");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot open chat template file " + path.string());
  }
  try {
    read_file_text(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot open " + path.string());
  }
}

TEST(FileText, DirectoryIsNotAFile) {
  const auto dir = std::filesystem::temp_directory_path();
  EXPECT_THROW(read_file_text(dir), Error);
  EXPECT_EQ(try_read_file_text(dir), std::nullopt);
}

}  // namespace
}  // namespace moeserve
