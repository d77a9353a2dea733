// The progress bar lives in core (weight loading uses it too); tools keep their old names.
#pragma once
#include "core/progress_bar.h"

namespace moeserve::tools {
using moeserve::format_duration;
using moeserve::format_progress_line;
using moeserve::ProgressBar;
}  // namespace moeserve::tools
