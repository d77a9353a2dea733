// Shared helpers of the tokenizer tests: the real Qwen3 tokenizer files, the corpus and its
// variants (same rules as tests/fixtures/tokenizer/reference_common.mjs), reference files, and
// the Node oracle.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace moeserve::text::testing {

std::filesystem::path qwen3_dir();
std::filesystem::path fixtures_dir();  // tests/fixtures/tokenizer
bool qwen3_available();

// Skips the current test when the Qwen3 tokenizer data is absent.
#define MOESERVE_REQUIRE_QWEN3()                                                          \
  do {                                                                                    \
    if (!::moeserve::text::testing::qwen3_available())                                    \
      GTEST_SKIP() << "the Qwen3 tokenizer is missing: run bash scripts/install-deps.sh " \
                      "(it fetches third_party/tokenizers/qwen3)";                        \
  } while (0)

const nlohmann::json& qwen3_tokenizer_json();
const nlohmann::json& qwen3_config_json();
const nlohmann::json& corpus();

// tokenizer.json of the real Qwen3 tokenizer with a corpus variant patch applied.
nlohmann::json apply_variant(const nlohmann::json& base, const nlohmann::json& patch);

// The tokenizer for a corpus variant ("qwen3", "qwen35", ...), loaded once per process.
const Tokenizer& variant_tokenizer(const std::string& variant);

// The Qwen3.5 pre-tokenizer regex (qwen35_arch.md section 5), from the corpus.
std::string qwen35_regex();

// A reference file (reference_ids_npm.json, reference_ids_hf.json), or nullopt if absent.
std::optional<nlohmann::json> load_reference(const std::string& file_name);

std::string case_text(const nlohmann::json& c);

// FNV-1a (64-bit) of the ids as little-endian uint32 bytes, as 16 hex digits.
std::string fnv1a64(const std::vector<int32_t>& ids);

// Runs the npm port of HF tokenizers on `texts` with the tokenizer in `tokenizer_json`.
// Returns nullopt (and the reason in *why) when node or node_modules is unavailable.
struct OracleOutput {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> decoded;  // decode(ids) by the oracle
  std::vector<std::string> nfc;      // each text in NFC (JavaScript's normalize)
};
std::optional<OracleOutput> run_node_oracle(const nlohmann::json& tokenizer_json,
                                            const std::vector<std::string>& texts,
                                            std::string* why);

}  // namespace moeserve::text::testing
