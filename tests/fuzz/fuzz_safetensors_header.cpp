// libFuzzer target: arbitrary bytes as a whole safetensors file into the header parser that
// SafetensorsFile::open uses. The only acceptable outcomes are a validated header or a
// moeserve::Error; any other exception, crash, sanitizer report or broken invariant of an
// accepted header is a finding.
//
// Build (own build directory):  cmake -S . -B build-fuzz -DMOESERVE_FUZZ=ON -DMOESERVE_CUDA=OFF
//     -DMOESERVE_BUILD_BENCH=OFF -DCMAKE_CXX_COMPILER=clang++-14 && cmake --build build-fuzz
//     --target fuzz_safetensors_header
// CTest runs it for 20 s (ctest -L fuzz). Longer, from build-fuzz/:
//   mkdir -p /tmp/st-corpus && ./tests/fuzz_safetensors_header -max_total_time=600 \
//       -dict=../tests/fuzz/safetensors.dict /tmp/st-corpus ../tests/fuzz/corpus/safetensors
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    __builtin_trap();
  }
}

// What an accepted header promises its readers.
void check_invariants(const moeserve::io::SafetensorsHeader& h, size_t file_size) {
  check(h.data_offset == 8 + h.header_size, "data_offset == 8 + N");
  check(h.data_offset <= file_size, "header within the file");
  const uint64_t data_size = file_size - h.data_offset;
  uint64_t covered = 0;
  for (const auto& t : h.tensors) {
    check(t.data_begin <= t.data_end && t.data_end <= data_size, "range within the data section");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      check(d >= 0, "non-negative dims");
      numel *= uint64_t(d);
    }
    check(numel * moeserve::dtype_size(t.dtype) == t.data_end - t.data_begin, "size matches shape");
    covered += t.data_end - t.data_begin;
  }
  check(covered == data_size, "ranges tile the data section");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const moeserve::io::SafetensorsHeader h = moeserve::io::parse_safetensors_header(bytes, "fuzz.safetensors");
    check_invariants(h, size);
  } catch (const moeserve::Error&) {
    // Rejected cleanly.
  }
  return 0;
}
