// meshfuser's exceptions. Everything meshfuser throws for a user's mistake is a meshfuser::Error
// (badArgument() when an argument itself is wrong); a broken invariant of meshfuser is an
// InternalError (please report it). The message names the input or tensor, the axis, the expected
// and the actual value. In Python these are meshfuser.Error / ArgumentError / InternalError.
#pragma once

#include <stdexcept>
#include <string>

namespace meshfuser {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, bool bad_argument = false)
      : std::runtime_error(message), bad_argument_(bad_argument) {}
  bool badArgument() const { return bad_argument_; }

 private:
  bool bad_argument_;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace meshfuser
