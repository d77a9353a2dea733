#include "text/pretokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "core/error.h"
#include "text/unicode.h"

namespace moeserve::text {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int len = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (len < 0) return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(len));
}

// Per-thread resources for matching. The match data holds only the overall match (one
// ovector pair), so one block serves every pattern. The JIT stack replaces PCRE2's default
// 32 KiB machine-stack area so that long subjects (a 100 KB run of spaces) cannot exhaust it.
struct ThreadMatchResources {
  pcre2_match_data* match_data = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadMatchResources() {
    match_data = pcre2_match_data_create(1, nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (!match_data) throw Error("out of memory creating PCRE2 match data");
  }
  ~ThreadMatchResources() {
    pcre2_match_data_free(match_data);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
  }
};

ThreadMatchResources& thread_resources() {
  thread_local ThreadMatchResources resources;
  return resources;
}

pcre2_jit_stack* thread_jit_stack(void*) { return thread_resources().jit_stack; }

}  // namespace

Regex::Regex(std::string_view pattern, Syntax syntax, std::string_view where)
    : pattern_(pattern), where_(where) {
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (syntax == Syntax::Literal) options = PCRE2_UTF | PCRE2_LITERAL;
  // The pattern itself comes from a JSON file and may be any bytes.
  check_utf8(pattern, fmt::format("the regex pattern of {}", where));
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (!code) {
    fail("cannot compile the regex of {} at pattern offset {}: {} (pattern: {})", where,
         error_offset, pcre2_message(error_code), pattern_);
  }
  code_ = code;
  // The JIT is an optimisation: without it (a platform without JIT support) the interpreter
  // gives the same matches.
  if (pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0) {
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    if (context) pcre2_jit_stack_assign(context, &thread_jit_stack, nullptr);
    match_context_ = context;
  }
}

Regex::~Regex() {
  pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::find_all(std::string_view subject, std::vector<MatchSpan>& out) const {
  auto* code = static_cast<const pcre2_code*>(code_);
  auto* context = static_cast<pcre2_match_context*>(match_context_);
  pcre2_match_data* match_data = thread_resources().match_data;
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t length = subject.size();
  size_t search_from = 0;
  size_t last_match_end = SIZE_MAX;
  while (search_from <= length) {
    const int rc = pcre2_match(code, data, length, search_from, PCRE2_NO_UTF_CHECK, match_data,
                               context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    // rc == 0 only says the ovector had no room for capture groups; the match is valid.
    if (rc < 0) {
      fail("regex of {} failed on a {}-byte input at offset {}: {}", where_, length,
           search_from, pcre2_message(rc));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start == end && start == last_match_end) {
      if (search_from >= length) break;
      search_from += utf8_sequence_length(static_cast<unsigned char>(subject[search_from]));
      continue;
    }
    out.push_back({static_cast<uint32_t>(start), static_cast<uint32_t>(end)});
    last_match_end = end;
    search_from = end;
  }
}

}  // namespace moeserve::text
