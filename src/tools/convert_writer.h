// Executes a ConvertPlan: streams every item's source bytes from the mapped checkpoint files
// into io::SafetensorsWriter shards. Memory stays bounded whatever the checkpoint size: a copy
// moves 64 MiB at a time, an INT4 module is quantised one group of columns at a time ([N, g]
// floats), an FP8 module one row of 128 x 128 blocks at a time ([128, K] floats); pages of the
// source are dropped from this process once their item is written.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "core/thread_pool.h"
#include "tools/convert_plan.h"
#include "tools/convert_shards.h"

namespace moeserve::tools {

struct WriteOptions {
  int64_t group_size = 128;  // INT4 group (the plan's)
  ThreadPool* pool = nullptr;
  // Called after each item with the source bytes processed so far (the progress bar).
  std::function<void(uint64_t)> on_progress;
};

// Writes the shard files into `dir`. A failure (a non-finite weight, a write error) throws; the
// shard being written is removed by its writer and the caller discards `dir`.
void write_shards(const ConvertPlan& plan, const std::vector<Shard>& shards, const std::filesystem::path& dir,
                  const WriteOptions& options);

}  // namespace moeserve::tools
