// Helpers for the streaming-parser tests: the ways one text is cut into pushes.
#pragma once
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace moeserve::text::testutil {

// Every way the tests feed `text` to a streaming parser:
//   - one push (the whole text) and no push at all of an empty text,
//   - two pushes, cut at every byte position,
//   - one byte per push,
//   - for each seed, random chunks of 1..16 bytes (tokens and speculative bursts),
//     with an empty push thrown in now and then.
inline std::vector<std::vector<std::string>> all_chunkings(std::string_view text, int seeds) {
  std::vector<std::vector<std::string>> out;
  out.push_back({std::string(text)});
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    out.push_back({std::string(text.substr(0, cut)), std::string(text.substr(cut))});
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  out.push_back(std::move(bytes));
  for (int seed = 0; seed < seeds; ++seed) {
    std::mt19937 rng(static_cast<unsigned>(seed) * 7919u + 17u);
    std::vector<std::string> chunks;
    std::size_t pos = 0;
    while (pos < text.size()) {
      if (rng() % 11 == 0) chunks.emplace_back();
      const std::size_t len = 1 + rng() % 16;
      chunks.emplace_back(text.substr(pos, len));
      pos += len;
    }
    out.push_back(std::move(chunks));
  }
  return out;
}

inline std::string describe(const std::vector<std::string>& chunks) {
  std::string s = "[";
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    if (i) s += ", ";
    s += testing::PrintToString(chunks[i]);
  }
  return s + "]";
}

}  // namespace moeserve::text::testutil
