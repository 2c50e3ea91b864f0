#include "support/log.h"

#include <memory>
#include <mutex>
#include <utility>

namespace shardwise::support {
namespace {

struct SinkState {
  std::mutex mutex;
  std::shared_ptr<const LogSink> sink;  // replaced whole, so a line in flight keeps its sink
  LogLevel least = LogLevel::Info;
};

SinkState& state() {
  static SinkState s;
  return s;
}

}  // namespace

void set_log_sink(LogSink sink, LogLevel least) {
  SinkState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.sink = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
  s.least = least;
}

bool log_enabled(LogLevel level) {
  SinkState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.sink != nullptr && static_cast<int>(level) >= static_cast<int>(s.least);
}

void log(LogLevel level, const std::string& line) {
  std::shared_ptr<const LogSink> sink;
  {
    SinkState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.sink || static_cast<int>(level) < static_cast<int>(s.least)) return;
    sink = s.sink;
  }
  try {
    (*sink)(level, line);
  } catch (...) {  // NOLINT(bugprone-empty-catch): see the header, logging never changes results
  }
}

}  // namespace shardwise::support
