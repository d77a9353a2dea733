#include "core/file_text.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace moeserve {

std::optional<std::string> try_read_file_text(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return std::nullopt;  // opens, but reads as empty
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return std::move(text).str();
}

std::string read_file_text(const std::filesystem::path& path, std::string_view what) {
  const std::string named = what.empty() ? path.string() : fmt::format("{} {}", what, path.string());
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("cannot read {}: it is a directory", named);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", named);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("cannot read {}", named);
  return std::move(text).str();
}

}  // namespace moeserve
