// The core's log: a few lines per search (what was tried, what was chosen, how long it
// took), sent to one sink the host installs. The Python module installs a sink that
// hands each line to Python's `logging` under the "shardwise.core" logger (rank-prefixed
// under torchrun); with no sink, lines are dropped and cost nothing but the check.
//
//   support::set_log_sink([](support::LogLevel level, const std::string& line) { ... });
//   if (support::log_enabled(support::LogLevel::Info))
//     support::log(support::LogLevel::Info, fmt::format("spmd search: {} candidates", n));
//
// Why a sink and not stderr: a library that prints cannot be silenced or routed; users
// of PyTorch configure `logging`, and torchrun's ranks need the rank on each line.
// The sink may be called from any thread that runs a search; it must be thread safe.
#pragma once

#include <functional>
#include <string>

namespace shardwise::support {

// Python logging's numbers, so a sink passes them through unchanged.
enum class LogLevel : int { Debug = 10, Info = 20, Warning = 30 };

using LogSink = std::function<void(LogLevel, const std::string&)>;

// Installs `sink` (an empty function removes it) and the least level it wants.
void set_log_sink(LogSink sink, LogLevel least = LogLevel::Info);

// Whether a line at `level` would reach a sink (build the message only then).
bool log_enabled(LogLevel level);

// Sends one line to the sink, if any wants it. An exception thrown by the sink is dropped:
// logging never changes what the core computes.
void log(LogLevel level, const std::string& line);

}  // namespace shardwise::support
