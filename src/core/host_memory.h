// How much host memory a new allocation can still get, so that a large pool (the CPU KV cache)
// is refused with a clear error before it is populated, not met by the out-of-memory killer
// halfway through (Linux overcommit accepts each mapping on its own).
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace moeserve {

// MemAvailable of a /proc/meminfo text, in bytes; nullopt when the line is missing or malformed.
std::optional<size_t> parse_mem_available(std::string_view meminfo);

// A cgroup v2 limit minus usage: memory.max's text ("max": no limit -> nullopt) and
// memory.current's; nullopt when either is malformed. Usage at or above the limit gives 0.
std::optional<size_t> cgroup_headroom(std::string_view memory_max, std::string_view memory_current);

// The smaller of MemAvailable and this process's cgroup v2 headroom (/sys/fs/cgroup/memory.max,
// memory.current), whichever the system reports; nullopt when it reports neither.
std::optional<size_t> available_host_memory();

}  // namespace moeserve
