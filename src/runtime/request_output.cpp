#include "runtime/request_output.h"

namespace moeserve::runtime {

std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
  }
  return "unknown";
}

}  // namespace moeserve::runtime
