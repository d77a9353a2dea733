// A whole file's bytes as a string: the one place that opens, reads and reports.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve {

// Throws moeserve::Error "cannot open <what> <path>" or "cannot read <what> <path>[: it is a
// directory]" (`what`, e.g. "chat template file", may be empty).
std::string read_file_text(const std::filesystem::path& path, std::string_view what = "");
// nullopt when the file cannot be opened or read (for files that may be absent, such as
// /proc or cgroup entries).
std::optional<std::string> try_read_file_text(const std::filesystem::path& path);

}  // namespace moeserve
