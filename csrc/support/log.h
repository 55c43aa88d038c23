// The one channel for what meshfuser prints: debug dumps (MESHFUSER_DUMP) and notices. Every line
// starts with "[meshfuser rank R]". By default lines go to stdout; the Python module installs a sink
// that hands them to Python's `logging` (logger "meshfuser.<topic>").
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace mf {

// topic: the MESHFUSER_DUMP name the text belongs to ("host_program", "recompile", ...), or
// "warning" for notices. Multi-line text is prefixed line by line.
void logText(const std::string& topic, const std::string& text);

// The rank printed in every line (set once the process group is known; 0 before).
void setLogRank(int64_t rank);
// Where lines go: called with (topic, prefixed text without a trailing newline). Null: stdout.
using LogSink = std::function<void(const std::string& topic, const std::string& text)>;
void setLogSink(LogSink sink);

}  // namespace mf
