// Access to the Python Jinja2 reference renderer
// (tests/fixtures/chat_templates/render_reference.py) from the tests, and helpers to
// compare moeserve's engine with it.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::text::testing {

std::string fixtures_dir();                // tests/fixtures/chat_templates
std::string qwen3_tokenizer_dir();         // third_party/tokenizers/qwen3 (from install-deps.sh)
std::string qwen35_template_path();        // tests/fixtures/chat_templates/qwen3_5.jinja
std::string read_text_file(const std::string& path);

// Runs `python3 render_reference.py <args...> OUT` and returns the parsed OUT. The
// arguments may name the input file written by the caller. Fails the test (throws)
// when Python or jinja2 is missing or the script fails.
nlohmann::ordered_json run_reference(const std::vector<std::string>& args);

// A template + variables rendered by both engines.
struct RenderCase {
  std::string template_source;
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
};

// Renders all cases with Python (one process) and returns {"output"} / {"error"} per case.
nlohmann::ordered_json reference_render(const std::vector<RenderCase>& cases);

// A scratch directory unique to this process and call.
std::string make_temp_dir(const std::string& tag);

}  // namespace moeserve::text::testing
