#include "support/log.h"

#include <atomic>
#include <iostream>
#include <mutex>

namespace mf {
namespace {

std::atomic<int64_t> g_rank{0};

std::mutex& sinkMutex() {
  static std::mutex m;
  return m;
}

LogSink& sink() {
  static LogSink s;
  return s;
}

}  // namespace

void setLogRank(int64_t rank) { g_rank = rank; }

void setLogSink(LogSink s) {
  std::lock_guard<std::mutex> lock(sinkMutex());
  sink() = std::move(s);
}

void logText(const std::string& topic, const std::string& text) {
  const std::string prefix = "[meshfuser rank " + std::to_string(g_rank.load()) + "] ";
  std::string lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines += (lines.empty() ? "" : "\n") + prefix + text.substr(start, end - start);
    start = end + 1;
  }
  if (lines.empty()) lines = prefix;
  LogSink s;
  {
    std::lock_guard<std::mutex> lock(sinkMutex());
    s = sink();
  }
  if (s) {
    s(topic, lines);
    return;
  }
  std::cout << lines << std::endl;
}

}  // namespace mf
