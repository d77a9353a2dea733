#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

#include "tools/progress_bar.h"

using namespace moeserve::tools;

TEST(ProgressBar, FormatsLines) {
  EXPECT_EQ(format_progress_line("requests", 50, 100, 4.0, 10, "req"),
            "requests [#####.....]  50/100  50% 12.5 req/s elapsed 00:04 eta 00:04");
  EXPECT_EQ(format_progress_line("x", 0, 3, 0.0, 3), "x [...] 0/3   0% 0.0 it/s elapsed 00:00");
  EXPECT_EQ(format_progress_line("x", 3, 3, 2.0, 3), "x [###] 3/3 100% 1.5 it/s elapsed 00:02");
  EXPECT_EQ(format_progress_line("bytes", 7, 0, 1.0), "bytes 7 7.0 it/s elapsed 00:01");
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(59.9), "00:59");
  EXPECT_EQ(format_duration(-1), "--:--");
}

namespace {
std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[256];
  while (size_t n = std::fread(buf, 1, sizeof buf, f)) s.append(buf, n);
  return s;
}
}  // namespace

TEST(ProgressBar, SummaryModePrintsOneLine) {
  std::FILE* f = std::tmpfile();
  {
    ProgressBar bar("work", 4, f, ProgressBar::Mode::Summary);
    EXPECT_FALSE(bar.interactive());
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; ++i) ts.emplace_back([&] { bar.advance(); });
    for (auto& t : ts) t.join();
    EXPECT_EQ(bar.done(), 4);
  }
  const std::string out = read_all(f);
  std::fclose(f);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.rfind("work [##############################] 4/4 100%", 0), 0u) << out;
}

TEST(ProgressBar, AutoModeOnAFileIsNotInteractive) {
  std::FILE* f = std::tmpfile();
  {
    ProgressBar bar("w", 1, f);
    EXPECT_FALSE(bar.interactive());
    bar.finish();
    bar.finish();  // a second finish is a no-op
  }
  const std::string out = read_all(f);
  std::fclose(f);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

TEST(ProgressBar, InteractiveModeRedrawsInPlace) {
  std::FILE* f = std::tmpfile();
  {
    ProgressBar bar("w", 2, f, ProgressBar::Mode::Interactive);
    bar.advance();
    bar.advance();  // reaching the total always redraws
  }
  const std::string out = read_all(f);
  std::fclose(f);
  EXPECT_EQ(out.front(), '\r');
  EXPECT_NE(out.find("\x1b[K"), std::string::npos);
  EXPECT_NE(out.find("2/2 100%"), std::string::npos);
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
}

TEST(ProgressBar, OffModeIsSilent) {
  std::FILE* f = std::tmpfile();
  {
    ProgressBar bar("w", 3, f, ProgressBar::Mode::Off);
    bar.advance(3);
    EXPECT_EQ(bar.done(), 3);
  }
  EXPECT_EQ(read_all(f), "");
  std::fclose(f);
}
