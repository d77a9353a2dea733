#include "tokenizer_fixtures.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "text/tokenizer_config.h"

namespace moeserve::text::testing {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path qwen3_dir() { return fs::path(MOESERVE_SOURCE_DIR) / "third_party/tokenizers/qwen3"; }

fs::path fixtures_dir() { return fs::path(MOESERVE_FIXTURES_DIR) / "tokenizer"; }

bool qwen3_available() {
  return fs::is_regular_file(qwen3_dir() / "tokenizer.json") &&
         fs::is_regular_file(qwen3_dir() / "tokenizer_config.json");
}

const json& qwen3_tokenizer_json() {
  static const json value = read_json_file(qwen3_dir() / "tokenizer.json");
  return value;
}

const json& qwen3_config_json() {
  static const json value = read_json_file(qwen3_dir() / "tokenizer_config.json");
  return value;
}

const json& corpus() {
  static const json value = read_json_file(fixtures_dir() / "corpus.json");
  return value;
}

json apply_variant(const json& base, const json& patch) {
  json tj = base;
  if (patch.contains("split_regex"))
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = patch["split_regex"];
  if (patch.contains("replace"))
    for (auto& [key, value] : patch["replace"].items()) tj[key] = value;
  if (patch.contains("added_tokens_update")) {
    for (auto& [content, flags] : patch["added_tokens_update"].items()) {
      bool found = false;
      for (auto& token : tj["added_tokens"]) {
        if (token["content"] == content) {
          for (auto& [flag, value] : flags.items()) token[flag] = value;
          found = true;
          break;
        }
      }
      if (!found) throw std::runtime_error("variant updates unknown added token " + content);
    }
  }
  if (patch.contains("added_tokens_extra"))
    for (const auto& token : patch["added_tokens_extra"]) tj["added_tokens"].push_back(token);
  return tj;
}

const Tokenizer& variant_tokenizer(const std::string& variant) {
  static std::mutex mutex;
  static std::map<std::string, Tokenizer> cache;
  std::lock_guard lock(mutex);
  auto it = cache.find(variant);
  if (it == cache.end()) {
    const json& patch = corpus().at("variants").at(variant);
    Tokenizer tokenizer = Tokenizer::from_json(apply_variant(qwen3_tokenizer_json(), patch),
                                               qwen3_config_json(), "qwen3[" + variant + "]");
    it = cache.emplace(variant, std::move(tokenizer)).first;
  }
  return it->second;
}

std::string qwen35_regex() {
  return corpus().at("variants").at("qwen35").at("split_regex").get<std::string>();
}

std::optional<json> load_reference(const std::string& file_name) {
  const fs::path path = fixtures_dir() / file_name;
  if (!fs::is_regular_file(path)) return std::nullopt;
  return read_json_file(path);
}

std::string case_text(const json& c) {
  const std::string unit = c.at("text").get<std::string>();
  const int repeat = c.value("repeat", 1);
  std::string text;
  text.reserve(unit.size() * static_cast<size_t>(repeat));
  for (int i = 0; i < repeat; ++i) text += unit;
  return text;
}

std::string fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int32_t id : ids) {
    uint32_t v = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) {
      h ^= v & 0xFF;
      h *= 0x100000001b3ULL;
      v >>= 8;
    }
  }
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016llx", static_cast<unsigned long long>(h));
  return buffer;
}

std::optional<OracleOutput> run_node_oracle(const json& tokenizer_json,
                                            const std::vector<std::string>& texts,
                                            std::string* why) {
  const fs::path source = MOESERVE_SOURCE_DIR;
  if (!fs::exists(source / "node_modules/@huggingface/tokenizers/package.json")) {
    *why = "node_modules/@huggingface/tokenizers is missing (run bash scripts/install-deps.sh)";
    return std::nullopt;
  }
  if (std::system("command -v node > /dev/null 2>&1") != 0) {
    *why = "node is not on PATH";
    return std::nullopt;
  }
  static std::atomic<int> counter{0};
  const fs::path dir = fs::temp_directory_path() /
                       ("moeserve_tok_oracle_" + std::to_string(::getpid()) + "_" +
                        std::to_string(counter++));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "tokenizer.json") << tokenizer_json.dump();
    std::ofstream(dir / "tokenizer_config.json") << qwen3_config_json().dump();
    std::ofstream(dir / "input.json") << json{{"texts", texts}}.dump();
  }
  const fs::path script = fixtures_dir() / "oracle_encode.mjs";
  const std::string command = "node '" + script.string() + "' '" +
                              (dir / "tokenizer.json").string() + "' '" +
                              (dir / "tokenizer_config.json").string() + "' '" +
                              (dir / "input.json").string() + "' '" +
                              (dir / "output.json").string() + "' 2> '" +
                              (dir / "stderr.txt").string() + "'";
  const int rc = std::system(command.c_str());
  if (rc != 0) {
    std::ifstream err(dir / "stderr.txt");
    std::stringstream message;
    message << err.rdbuf();
    fs::remove_all(dir);
    throw std::runtime_error("the node oracle failed (" + command + "): " + message.str());
  }
  const json output = read_json_file(dir / "output.json");
  fs::remove_all(dir);
  OracleOutput result;
  result.ids = output.at("ids").get<std::vector<std::vector<int32_t>>>();
  result.decoded = output.at("decoded").get<std::vector<std::string>>();
  result.nfc = output.at("nfc").get<std::vector<std::string>>();
  return result;
}

}  // namespace moeserve::text::testing
