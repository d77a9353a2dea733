#include "reference_oracle.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace moeserve::text::testing {
namespace fs = std::filesystem;

std::string fixtures_dir() { return std::string(MOESERVE_FIXTURES_DIR) + "/chat_templates"; }

std::string qwen3_tokenizer_dir() {
  std::string dir = std::string(MOESERVE_SOURCE_DIR) + "/third_party/tokenizers/qwen3";
  if (!fs::exists(dir + "/tokenizer_config.json"))
    throw std::runtime_error(dir + "/tokenizer_config.json is missing: run scripts/install-deps.sh");
  return dir;
}

std::string qwen35_template_path() { return fixtures_dir() + "/qwen3_5.jinja"; }

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string make_temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  fs::path dir = fs::temp_directory_path() /
                 ("moeserve-jinja-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::create_directories(dir);
  return dir.string();
}

namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

// The interpreter behind `python3` (a pyenv shim costs seconds per start), found once.
const std::string& python_executable() {
  static const std::string path = [] {
    std::string result = "python3";
    if (FILE* pipe = ::popen("python3 -c 'import sys; print(sys.executable)' 2>/dev/null", "r")) {
      char buf[4096];
      std::string out;
      while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
      ::pclose(pipe);
      while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
      if (!out.empty() && fs::exists(out)) result = out;
    }
    return result;
  }();
  return path;
}

}  // namespace

nlohmann::ordered_json run_reference(const std::vector<std::string>& args) {
  std::string dir = make_temp_dir("ref");
  std::string out_path = dir + "/out.json";
  std::string err_path = dir + "/stderr.txt";
  std::string command = shell_quote(python_executable()) + " " + shell_quote(fixtures_dir() + "/render_reference.py");
  for (const auto& a : args) command += " " + shell_quote(a);
  command += " " + shell_quote(out_path) + " 2>" + shell_quote(err_path);
  int rc = std::system(command.c_str());
  if (rc != 0) {
    std::string err = fs::exists(err_path) ? read_text_file(err_path) : "";
    fs::remove_all(dir);
    throw std::runtime_error("the Python reference renderer failed (needs python3 with jinja2 3.1; "
                             "scripts/install-deps.sh installs it): " + command + "\n" + err);
  }
  nlohmann::ordered_json result = nlohmann::ordered_json::parse(read_text_file(out_path));
  fs::remove_all(dir);
  return result;
}

nlohmann::ordered_json reference_render(const std::vector<RenderCase>& cases) {
  nlohmann::ordered_json input = nlohmann::ordered_json::array();
  for (const auto& c : cases) input.push_back({{"template", c.template_source}, {"context", c.context}});
  std::string dir = make_temp_dir("batch");
  std::string in_path = dir + "/in.json";
  {
    std::ofstream out(in_path, std::ios::binary);
    out << input.dump();
  }
  nlohmann::ordered_json result = run_reference({"batch", in_path});
  fs::remove_all(dir);
  return result;
}

}  // namespace moeserve::text::testing
