#pragma once

namespace mf {
constexpr const char* kVersion = "0.1.0";
}
