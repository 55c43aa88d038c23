#include "support/text.h"

#include <charconv>
#include <system_error>

namespace mf {

std::string numberText(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(x);
}

std::string listText(const std::vector<std::string>& items) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s + "]";
}

std::string listText(const std::vector<int64_t>& values) {
  std::vector<std::string> items;
  for (int64_t v : values) items.push_back(std::to_string(v));
  return listText(items);
}

namespace {
constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;
}  // namespace

uint64_t fnv1a(const std::string& bytes) {
  uint64_t h = kFnvOffset;
  for (unsigned char c : bytes) h = (h ^ c) * kFnvPrime;
  return h;
}

uint64_t fnv1a(const std::vector<int64_t>& values) {
  uint64_t h = kFnvOffset;
  for (int64_t v : values) h = (h ^ static_cast<uint64_t>(v)) * kFnvPrime;
  return h;
}

}  // namespace mf
