#include "core/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace moeserve {

namespace {
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  auto total = int64_t(seconds);
  int64_t h = total / 3600, m = (total / 60) % 60, s = total % 60;
  if (h > 0) return fmt::format("{}:{:02}:{:02}", h, m, s);
  return fmt::format("{:02}:{:02}", m, s);
}

std::string format_progress_line(const std::string& label, int64_t done, int64_t total,
                                 double elapsed_s, int bar_width, const std::string& unit) {
  std::string line = label;
  const double rate = elapsed_s > 0 ? double(done) / elapsed_s : 0.0;
  if (total > 0) {
    const int64_t shown = std::clamp<int64_t>(done, 0, total);
    const int filled = int(shown * bar_width / total);
    line += fmt::format(" [{}{}] {:>{}}/{} {:3}%", std::string(size_t(filled), '#'),
                        std::string(size_t(bar_width - filled), '.'), done,
                        int(std::to_string(total).size()), total, int(shown * 100 / total));
  } else {
    line += fmt::format(" {}", done);
  }
  line += fmt::format(" {:.1f} {}/s elapsed {}", rate, unit, format_duration(elapsed_s));
  if (total > 0 && done > 0 && done < total)
    line += fmt::format(" eta {}", format_duration(double(total - done) / rate));
  return line;
}

ProgressBar::ProgressBar(std::string label, int64_t total, std::FILE* out, Mode mode, std::string unit)
    : label_(std::move(label)),
      total_(total),
      out_(out),
      interactive_(mode == Mode::Interactive ||
                   (mode == Mode::Auto && out != nullptr && isatty(fileno(out)))),
      silent_(mode == Mode::Off || out == nullptr),
      unit_(std::move(unit)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (interactive_) draw_locked(false);
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  done_ += n;
  if (!interactive_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ >= kRedrawInterval || (total_ > 0 && done_ >= total_)) draw_locked(false);
}

void ProgressBar::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  draw_locked(true);
}

int64_t ProgressBar::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void ProgressBar::draw_locked(bool final_draw) {
  if (silent_) return;
  auto now = std::chrono::steady_clock::now();
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::string line = format_progress_line(label_, done_, total_, elapsed, 30, unit_);
  if (interactive_) {
    // "\r" returns to column 0; ESC[K erases what a longer previous line left behind.
    std::fprintf(out_, "\r%s\x1b[K%s", line.c_str(), final_draw ? "\n" : "");
  } else if (final_draw) {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

}  // namespace moeserve
