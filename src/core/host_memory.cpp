#include "core/host_memory.h"

#include <algorithm>
#include <charconv>
#include <string>

#include "core/file_text.h"

namespace moeserve {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::optional<size_t> parse_size(std::string_view s) {
  s = trim(s);
  size_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

}  // namespace

std::optional<size_t> parse_mem_available(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  size_t at = 0;
  while (at < meminfo.size()) {
    const size_t eol = std::min(meminfo.find('\n', at), meminfo.size());
    std::string_view line = meminfo.substr(at, eol - at);
    at = eol + 1;
    if (!line.starts_with(kKey)) continue;
    line = trim(line.substr(kKey.size()));
    if (!line.ends_with(" kB")) return std::nullopt;  // the kernel's unit for this line
    const auto kb = parse_size(line.substr(0, line.size() - 3));
    if (!kb) return std::nullopt;
    return *kb * 1024;
  }
  return std::nullopt;
}

std::optional<size_t> cgroup_headroom(std::string_view memory_max, std::string_view memory_current) {
  if (trim(memory_max) == "max") return std::nullopt;
  const auto limit = parse_size(memory_max), used = parse_size(memory_current);
  if (!limit || !used) return std::nullopt;
  return *used >= *limit ? 0 : *limit - *used;
}

std::optional<size_t> available_host_memory() {
  std::optional<size_t> avail;
  if (const auto meminfo = try_read_file_text("/proc/meminfo")) avail = parse_mem_available(*meminfo);
  const auto max = try_read_file_text("/sys/fs/cgroup/memory.max");
  const auto cur = try_read_file_text("/sys/fs/cgroup/memory.current");
  if (max && cur)
    if (const auto room = cgroup_headroom(*max, *cur)) avail = avail ? std::min(*avail, *room) : *room;
  return avail;
}

}  // namespace moeserve
