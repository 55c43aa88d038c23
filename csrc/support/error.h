// Two kinds of failure, two macros.
//  MF_USER_CHECK(cond, ...): the user gave us something wrong. The message must name the input or
//    tensor, the axis, the expected and the actual value. Surfaces in Python as meshfuser.Error.
//  MF_USER_ARG_CHECK(cond, ...): as above, for a bad argument; also a ValueError in Python.
//  MF_CHECK(cond, ...): an invariant of meshfuser itself broke. The message says it is a bug.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "meshfuser/error.h"

namespace mf {

template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream ss;
  (ss << ... << args);
  return ss.str();
}

// The public exception types (include/meshfuser/error.h), so that C++ users catch what the
// runtime throws without translation.
using UserError = ::meshfuser::Error;
using InternalError = ::meshfuser::InternalError;

[[noreturn]] void throwInternal(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace mf

#define MF_USER_CHECK(cond, ...) \
  do {                           \
    if (!(cond)) throw ::mf::UserError(::mf::str(__VA_ARGS__)); \
  } while (0)

#define MF_USER_ARG_CHECK(cond, ...) \
  do {                               \
    if (!(cond)) throw ::mf::UserError(::mf::str(__VA_ARGS__), /*bad_argument=*/true); \
  } while (0)

#define MF_CHECK(cond, ...) \
  do {                      \
    if (!(cond)) ::mf::throwInternal(__FILE__, __LINE__, #cond, ::mf::str("", ##__VA_ARGS__)); \
  } while (0)

#define MF_THROW_USER(...) throw ::mf::UserError(::mf::str(__VA_ARGS__))
#define MF_THROW_INTERNAL(...) ::mf::throwInternal(__FILE__, __LINE__, "unreachable", ::mf::str(__VA_ARGS__))
