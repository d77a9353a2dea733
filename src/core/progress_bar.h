// A small thread-safe progress bar for long-running work (bench, convert, weight loading).
//
// On a terminal it redraws one line in place ("\r" + ANSI erase-line), at most ~10 times a
// second:
//     requests [##########..........]  50/100  50%  12.3 it/s  elapsed 00:04  eta 00:04
// When the stream is not a terminal (CI logs, pipes) it prints nothing while running and one
// plain summary line at finish(), so logs are not flooded with carriage returns.
// Modes: Auto (Interactive on a terminal, else Summary), Interactive, Summary, Off (silent).
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace moeserve {

// Renders one bar line (no "\r", no newline). `elapsed_s` is the time since start; the rate is
// done / elapsed_s and the ETA (remaining / rate) is shown once at least one item is done.
// `total` <= 0 means unknown: no bar, no percentage, no ETA. Pure, for tests.
std::string format_progress_line(const std::string& label, int64_t done, int64_t total,
                                 double elapsed_s, int bar_width = 30,
                                 const std::string& unit = "it");

// "mm:ss", or "h:mm:ss" from one hour on; negative or non-finite values print as "--:--".
std::string format_duration(double seconds);

class ProgressBar {
 public:
  enum class Mode { Auto, Interactive, Summary, Off };

  // `out` is usually stderr. Mode::Auto draws in place iff `out` is a terminal.
  ProgressBar(std::string label, int64_t total, std::FILE* out = stderr, Mode mode = Mode::Auto,
              std::string unit = "it");
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Adds `n` finished items (callable from any thread).
  void advance(int64_t n = 1);
  // Draws the final state and ends the line; later calls are no-ops. Called by the destructor.
  void finish();

  int64_t done() const;
  bool interactive() const { return interactive_; }

 private:
  void draw_locked(bool final_draw);

  std::string label_;
  int64_t total_;
  std::FILE* out_;
  bool interactive_;
  bool silent_;
  std::string unit_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  mutable std::mutex mutex_;
  int64_t done_ = 0;
  bool finished_ = false;
};

}  // namespace moeserve
